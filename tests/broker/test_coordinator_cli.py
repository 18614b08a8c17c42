"""Coordinator checkpoints and resume guard, and the broker/coordinator/broker-config commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from neurofed.broker.checkpoint import CheckpointError, load_server_checkpoint, save_server_checkpoint
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.broker.embedded import free_port, port_open
from neurofed.broker.transport import MqttTransport
from neurofed.trainer.fl.server import ServerState

NEUROFED = [sys.executable, "-c", "from neurofed.cli import main; main()"]


@pytest.mark.unit
def test_checkpoint_round_trip_is_atomic_and_exact(tmp_path):
    s = ServerState({"w": torch.randn(3, 4), "n": torch.tensor(5)}, 7, {"scaffold_c.w": torch.ones(3, 4)})
    save_server_checkpoint(tmp_path, s, {"fingerprint": "x", "metrics": [{"round": 7}]})
    got, info = load_server_checkpoint(tmp_path)
    assert got.round == 7 and info["metrics"] == [{"round": 7}]
    assert torch.equal(got.global_state["w"], s.global_state["w"]) and torch.equal(got.extras["scaffold_c.w"], torch.ones(3, 4))
    assert not list(tmp_path.glob("*.tmp"))
    assert load_server_checkpoint(tmp_path / "none") is None


@pytest.mark.unit
def test_resume_refuses_a_different_configuration(tmp_path):
    cfg = config_from_dict({"federation": {"name": "a", "rounds": 3}, "output": {"dir": str(tmp_path)}})
    c = Coordinator(cfg, "mqtt://127.0.0.1:1")
    c.server.round = 2
    c._checkpoint()
    again = Coordinator(cfg, "mqtt://127.0.0.1:1", resume=True)
    assert again.server.round == 2
    other = config_from_dict({"federation": {"name": "a", "rounds": 4}, "output": {"dir": str(tmp_path)}})
    with pytest.raises(CheckpointError, match="different federation config"):
        Coordinator(other, "mqtt://127.0.0.1:1", resume=True)
    assert json.loads((tmp_path / "metrics.json").read_text())["federation"] == "a"


def test_coordinator_bad_config_is_one_clear_line(tmp_path):
    p = tmp_path / "f.toml"
    p.write_text("[federation]\nrounds = 0\nunknown_key = 1\n")
    r = subprocess.run(NEUROFED + ["coordinator", "--config", str(p)], check=False, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "federation.rounds" in r.stderr and "unknown_key" in r.stderr
    assert "Traceback" not in r.stderr


def test_neurofed_broker_command_serves_mqtt():
    port = free_port()
    p = subprocess.Popen(NEUROFED + ["broker", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 30
        while not port_open("127.0.0.1", port) and time.monotonic() < end:
            time.sleep(0.1)
        with MqttTransport(f"mqtt://127.0.0.1:{port}", "probe") as t:
            assert t.mqtt_version == "3.1.1"
    finally:
        p.kill()
        p.wait(10)


def test_broker_config_command_writes_locked_down_files(tmp_path):
    r = subprocess.run(NEUROFED + ["broker-config", "--out", str(tmp_path / "m"), "--federation", "lab",
                                   "--clients", "S001,S002", "--port", "18883"],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    conf = (tmp_path / "m" / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf and "listener 18883 127.0.0.1" in conf
    assert "set_tcp_nodelay true" in conf.splitlines()
    acl = (tmp_path / "m" / "acl").read_text()
    assert "user S001\n" in acl and "topic write neurofed/lab/update/S001" in acl
    assert "topic write neurofed/lab/task" not in acl.split("user S001")[1]
    creds = json.loads((tmp_path / "m" / "credentials.json").read_text())
    assert set(creds) == {"coordinator", "S001", "S002"}
    passwd = (tmp_path / "m" / "passwd").read_text()
    assert all(pw not in passwd for pw in creds.values())  # hashed
    assert (tmp_path / "m" / "credentials.json").stat().st_mode & 0o077 == 0


def test_broker_config_sizes_its_limits_from_the_federation_config(tmp_path):
    """Issue 54 (D2): with --config the packet limit is the federation's largest legitimate frame (EEGNet here:
    about a MiB, header cap included) and the queue fits every client's messages of a round."""
    from neurofed.broker.config import load_config
    from neurofed.broker.coordinator import largest_body
    from neurofed.broker.secure import BrokerLimits

    toml = tmp_path / "federation.toml"
    toml.write_text('[federation]\nname = "fleet"\nstrategy = "fedavg"\n')
    ids = ",".join(f"c{i}" for i in range(2000))
    r = subprocess.run(NEUROFED + ["broker-config", "--out", str(tmp_path / "m"), "--config", str(toml),
                                   "--clients", ids], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = BrokerLimits(2000, largest_body(load_config(toml)))
    conf = (tmp_path / "m" / "mosquitto.conf").read_text().splitlines()
    assert f"max_packet_size {want.max_packet_size}" in conf and want.max_packet_size < 6 << 20  # a model frame or a signed release (4 MiB), not 64 MiB
    assert "max_queued_messages 16008" in conf and f"max_queued_bytes {want.max_queued_bytes}" in conf
    assert "topic write neurofed/fleet/update/c1999" in (tmp_path / "m" / "acl").read_text()  # the config's name
