"""Issue 54 (D2): the Mosquitto configuration `neurofed broker-config` writes is sized for the fleet.

A real Mosquitto runs the generated mosquitto.conf (passwords, ACL, the sized limits); 1,000 simulated clients
(:class:`neurofed.bench_secagg.SecAggSwarm`, a few per process, each process logged in as a user the test adds
with read/write on the federation's topics) join and upload to a real coordinator. Mosquitto's default queue
(1000 messages per client) once dropped joins bound for the coordinator at this size ("987 of 1000 clients
joined"); the control test shows the same harness catches such drops when the queue is too small.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from neurofed.bench_secagg import run_rounds
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import FederationError, largest_body
from neurofed.broker.embedded import free_port
from neurofed.broker.protocol import Topics, body_cap, frame_cap
from neurofed.broker.secure import BrokerLimits, SecureBrokerSpec, write_broker_config
from tests.broker.conftest import Mosquitto

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto not installed")

DROPPED = "Outgoing messages are being dropped"


def fleet_config(fed: str) -> dict:
    """The federation run_rounds runs (FedAvg, EEGNet): what the broker is sized for."""
    return {"federation": {"name": fed, "strategy": "fedavg", "strategy_overrides": {"clip_mult": 0.0}}}


class FleetBroker:
    """Mosquitto with `neurofed broker-config`'s files for ``n`` clients, plus ``swarms`` users that may
    publish for any client of the federation (each swarm process multiplexes many clients on one login)."""

    def __init__(self, tmp_path: Path, fed: str, n: int, swarms: int, extra: tuple[str, ...] = ()) -> None:
        # mosquitto drops to user mosquitto: its files sit in a folder that user can traverse and write its log in
        self.dir = Path(tempfile.mkdtemp(prefix="neurofed-fleet-"))
        os.chmod(self.dir, 0o755)
        self.log = self.dir / "mosquitto.log"
        self.log.touch()
        os.chmod(self.log, 0o666)
        port = free_port()
        ids = [f"sim{i:04d}" for i in range(n)]
        self.spec = SecureBrokerSpec(fed, ids, port=port, max_body=largest_body(config_from_dict(fleet_config(fed))),
                                     extra=[f"log_dest file {self.log}", "log_type error", "log_type warning",
                                            "log_type notice", *extra])
        files = write_broker_config(self.spec, self.dir)
        self.creds = json.loads(files.credentials.read_text())
        acl = files.acl.read_text()
        for k in range(swarms):
            subprocess.run(["mosquitto_passwd", "-b", str(files.passwd), f"swarm{k}", f"pw{k}"], check=True,
                           capture_output=True, timeout=30)
            acl += f"\nuser swarm{k}\ntopic readwrite {Topics(fed).all()}\n"
        files.acl.write_text(acl)
        if os.geteuid() == 0:  # what write_broker_config does for its own files
            shutil.chown(files.passwd, "mosquitto")
            shutil.chown(files.acl, "mosquitto")
        self.conf = files.conf.read_text()
        self.m = Mosquitto(tmp_path, extra_conf=self.conf, port=port).start()
        self.url = f"mqtt://coordinator:{self.creds['coordinator']}@127.0.0.1:{port}"
        self.swarm_urls = [f"mqtt://swarm{k}:pw{k}@127.0.0.1:{port}" for k in range(swarms)]

    def dropped(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if DROPPED in line]

    def close(self) -> None:
        self.m.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.unit
def test_limits_are_derived_from_the_model_and_the_fleet():
    cfg = config_from_dict(fleet_config("f"))
    body = largest_body(cfg)
    from neurofed.broker.coordinator import initial_model

    state = initial_model(cfg).state_dict()
    assert body >= body_cap(state)  # a model message fits
    small, big = BrokerLimits(10, body), BrokerLimits(10_000, body)
    assert small.max_queued_messages == 1000  # Mosquitto's default stays the floor
    assert big.max_queued_messages >= 8 * 10_000  # every client's messages of a round can wait at once
    assert big.max_packet_size == small.max_packet_size >= frame_cap(body)
    assert big.max_packet_size < 6 << 20  # EEGNet frames or a 4 MiB signed release, not the old fixed 64 MiB
    lines = "\n".join(big.conf_lines())
    for key in ("max_packet_size", "max_queued_messages", "max_queued_bytes", "max_inflight_messages"):
        assert f"\n{key} " in lines
    assert "dropped joins at 1,000 clients" in lines  # the comment says why


@pytest.mark.slow
def test_a_thousand_clients_all_join_and_upload_through_the_generated_config(tmp_path, fed_name):
    n = 1000
    b = FleetBroker(tmp_path, fed_name, n, swarms=2)
    try:
        assert f"max_queued_messages {BrokerLimits(n).max_queued_messages}" in b.conf
        res = run_rounds(b.url, n, secure=False, rounds=1, procs=2, fed=fed_name, swarm_urls=b.swarm_urls,
                         federation={"join_timeout_s": 90, "round_deadline_s": 90})
        print(f"{n} clients: joined {res['joined']} in {res['join_s']} s, round {res['rounds'][0]['round_s']} s")
        assert res["joined"] == n
        assert res["rounds"][0]["participants"] == n  # every update of the round arrived
        assert res["rejections"] == {}
        assert b.dropped() == []
    finally:
        b.close()


@pytest.mark.slow
def test_control_a_queue_too_small_for_the_fleet_drops_joins(tmp_path, fed_name):
    """The same harness with Mosquitto's queue cut below the fleet's burst (what the default did at 1,000
    clients): the broker drops messages bound for the coordinator and the federation cannot start."""
    n = 300
    b = FleetBroker(tmp_path, fed_name, n, swarms=1, extra=("max_queued_messages 5", "max_inflight_messages 1"))
    try:
        # The join window must outlast the swarm's start (a spawned interpreter importing torch, then the model):
        # under a loaded test run that took more than 15 s, so the federation failed before any join was sent.
        with pytest.raises(FederationError, match=f"of {n} training clients joined") as err:
            run_rounds(b.url, n, secure=False, rounds=1, procs=1, fed=fed_name, swarm_urls=b.swarm_urls,
                       federation={"join_timeout_s": 60})
        assert b.dropped(), f"the broker logged no dropped messages ({err.value})"
    finally:
        b.close()
