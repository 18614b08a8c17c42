"""`neurofed broker-config` output run by a real mosquitto: auth and per-client ACL enforced."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from neurofed.broker.embedded import free_port
from neurofed.broker.protocol import Topics
from neurofed.broker.secure import BrokerConfigError, SecureBrokerSpec, write_broker_config
from neurofed.broker.transport import AuthError, MqttTransport
from tests.broker.conftest import Mosquitto, settle

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto not installed")


@pytest.fixture
def secured(tmp_path, fed_name):
    # mosquitto drops to user mosquitto: its files must sit in a folder that user can traverse
    # (pytest's tmp_path lives under a 0700 folder)
    cfg_dir = Path(tempfile.mkdtemp(prefix="neurofed-mosq-"))
    os.chmod(cfg_dir, 0o755)
    port = free_port()
    files = write_broker_config(SecureBrokerSpec(fed_name, ["A", "B"], port=port), cfg_dir)
    assert "allow_anonymous false" in files.conf.read_text()
    m = Mosquitto(tmp_path, extra_conf=files.conf.read_text(), port=port)
    m.start()
    yield m, json.loads(files.credentials.read_text()), Topics(fed_name)
    m.stop()
    shutil.rmtree(cfg_dir, ignore_errors=True)


def _url(m, user=None, pw=None):
    return f"mqtt://{user}:{pw}@127.0.0.1:{m.port}" if user else m.url


def _messages(t, timeout=1.5):
    got, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        i = t.get(0.1)
        if i is not None and i.event == "message":
            got.append(i.topic)
    return got


def test_anonymous_and_wrong_password_are_refused(secured):
    m, creds, _ = secured
    with pytest.raises(AuthError):
        MqttTransport(_url(m), "anon").connect(timeout=5)
    with pytest.raises(AuthError):
        MqttTransport(_url(m, "A", "wrong"), "A").connect(timeout=5)
    ok = MqttTransport(_url(m, "A", creds["A"]), "A").connect(timeout=5)
    assert ok.connected
    ok.close()


def test_client_cannot_publish_as_another_or_as_coordinator(secured):
    m, creds, t = secured
    coord = MqttTransport(_url(m, "coordinator", creds["coordinator"]), "coord").connect()
    coord.subscribe(t.all())
    a = MqttTransport(_url(m, "A", creds["A"]), "A").connect()
    b = MqttTransport(_url(m, "B", creds["B"]), "B").connect()
    b.subscribe(t.task)
    b.subscribe(t.update("A"))
    settle(b, t.status("B"))
    settle(coord, t.status("coordinator"), drop_earlier=True)  # (it reads B's marker too)
    for topic in (t.update("B"), t.status("B"), t.join("B"), t.task, t.model, t.extras):  # all forbidden for A
        a.publish(topic, b"forged", wait=5)
    a.publish(t.update("A"), b"mine", wait=5)
    seen = _messages(coord)
    assert seen == [t.update("A")]
    assert t.update("A") not in _messages(b, 0.5)  # B cannot read A's update either
    coord.publish(t.task, b"task", wait=5)
    assert _messages(b) == [t.task]
    b.subscribe(t.extras)  # a strategy's cached extras (FedBM's generator) are for every client
    settle(b, t.status("B"))  # the SUBSCRIBE and the coordinator's PUBLISH travel on different connections
    coord.publish(t.extras, b"extras", wait=5)
    assert _messages(b) == [t.extras]
    b.subscribe(t.result)  # per-round participants and loss are for the coordinator only
    coord.publish(t.result, b"result", wait=5)
    assert _messages(b, 0.5) == []
    for x in (coord, a, b):
        x.close()


def test_secagg_topics_under_the_acl(secured):
    """A client publishes only on its own secagg/<id> and reads only its own secagg_down/<id>."""
    m, creds, t = secured
    coord = MqttTransport(_url(m, "coordinator", creds["coordinator"]), "coord").connect()
    coord.subscribe(f"{t.root}/secagg/+")
    a = MqttTransport(_url(m, "A", creds["A"]), "A").connect()
    b = MqttTransport(_url(m, "B", creds["B"]), "B").connect()
    a.subscribe(t.secagg_down("A"))
    b.subscribe(t.secagg_down("A"))  # B may not read what the coordinator routes to A
    b.subscribe(t.secagg("A"))       # nor A's shares and masked input
    settle(coord, t.secagg("coordinator"))
    settle(a, t.status("A"))
    settle(b, t.status("B"))
    a.publish(t.secagg("B"), b"forged", wait=5)
    a.publish(t.secagg_down("B"), b"forged", wait=5)
    a.publish(t.secagg("A"), b"mine", wait=5)
    assert _messages(coord) == [t.secagg("A")]
    coord.publish(t.secagg_down("A"), b"routed", wait=5)
    assert _messages(a) == [t.secagg_down("A")]
    assert _messages(b, 0.5) == []
    for x in (coord, a, b):
        x.close()


@pytest.mark.unit
def test_bad_specs_are_refused(tmp_path):
    with pytest.raises(BrokerConfigError, match="reserved"):
        SecureBrokerSpec("f", ["coordinator"])
    with pytest.raises(BrokerConfigError, match="both"):
        SecureBrokerSpec("f", ["A"], tls_cert=tmp_path / "c.pem")
    from neurofed.broker.protocol import ProtocolError

    with pytest.raises(ProtocolError):
        SecureBrokerSpec("f", ["a/b"])


def _openssl(*args: str, cwd: Path) -> None:
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_listener_with_generated_config(fed_name):
    """A throwaway CA + server certificate; mqtts:// with the CA works, without it fails."""
    from neurofed.broker.transport import TransportError

    d = Path(tempfile.mkdtemp(prefix="neurofed-tls-"))
    os.chmod(d, 0o755)
    try:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
                 "-subj", "/CN=neurofed-test-ca", cwd=d)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=127.0.0.1", cwd=d)
        (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf", cwd=d)
        for f in d.iterdir():
            os.chmod(f, 0o644)
        port = free_port()
        files = write_broker_config(SecureBrokerSpec(fed_name, ["A"], port=port, tls_cert=d / "server.pem",
                                                     tls_key=d / "server.key", tls_ca=d / "ca.pem"), d / "cfg")
        os.chmod(d / "cfg", 0o755)
        m = Mosquitto(d, extra_conf=files.conf.read_text(), port=port).start()
        try:
            creds = json.loads(files.credentials.read_text())
            url = f"mqtts://A:{creds['A']}@127.0.0.1:{port}"
            with MqttTransport(url, "A", ca_certs=str(d / "ca.pem")) as t:
                assert t.connected
                t.publish(Topics(fed_name).status("A"), b"x", wait=5)
            with pytest.raises(TransportError):
                MqttTransport(url, "A2").connect(timeout=5)  # system CAs do not trust our test CA
        finally:
            m.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_credentialed_client_cannot_take_over_another_clients_id(secured):
    """``use_username_as_clientid``: B connecting under A's MQTT client id does not kick A off."""
    m, creds, t = secured
    a = MqttTransport(_url(m, "A", creds["A"]), "A", reconnect_max_s=1).connect()
    coord = MqttTransport(_url(m, "coordinator", creds["coordinator"]), "coord").connect()
    coord.subscribe(t.update("A"))
    events: list[str] = []
    b = MqttTransport(_url(m, "B", creds["B"]), "A").connect()  # B claims A's client id
    b2 = MqttTransport(_url(m, "B", creds["B"]), "A").connect()  # ... and again
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        i = a.get(0.1)
        if i is not None and i.event != "message":
            events.append(i.event)
    assert a.connected and "disconnected" not in events, events
    a.publish(t.update("A"), b"still-me", wait=5)
    assert _messages(coord) == [t.update("A")]
    for x in (a, b, b2, coord):
        x.close()
