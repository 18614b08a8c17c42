"""The in-memory broker routes like Mosquitto for what the protocol uses (tests/broker/memory_broker.py)."""

from __future__ import annotations

import pytest

from neurofed.broker.transport import TransportError
from tests.broker.memory_broker import MemoryBroker, MemoryTransport, topic_matches


def _drain(t: MemoryTransport) -> list[tuple[str, str, bytes, bool]]:
    out = []
    while (item := t.get(0)) is not None:
        out.append((item.event, item.topic, item.payload, item.retain))
    return out


def test_topic_filters():
    assert topic_matches("neurofed/f/update/+", "neurofed/f/update/S001")
    assert not topic_matches("neurofed/f/update/+", "neurofed/f/update/S001/x")
    assert topic_matches("neurofed/#", "neurofed/f/model/unicorn8")
    assert topic_matches("neurofed/f/model", "neurofed/f/model") and not topic_matches("neurofed/f/model", "neurofed/f")
    assert not topic_matches("#", "$SYS/broker/uptime")


def test_retained_no_local_will_and_takeover():
    b = MemoryBroker()
    try:
        a = MemoryTransport(b.url, "a", will=("w/status/a", b"offline")).connect()
        a.publish("w/model", b"m1", retain=True)
        a.publish("w/model", b"m2", retain=True)
        c = MemoryTransport(b.url, "c").connect()
        c.subscribe("w/#")
        assert _drain(c) == [("connected", "", b"", False), ("message", "w/model", b"m2", True)]
        a.subscribe("w/error/+", no_local=True)
        a.publish("w/error/a", b"mine")
        assert _drain(a) == [("connected", "", b"", False)]  # not echoed to its author
        assert _drain(c) == [("message", "w/error/a", b"mine", False)]
        a.publish("w/model", b"", retain=True)  # clears the retained model
        assert "w/model" not in b.retained and _drain(c) == [("message", "w/model", b"", False)]
        a.kill()  # no DISCONNECT: the will goes out, retained
        assert _drain(c) == [("message", "w/status/a", b"offline", False)] and b.retained["w/status/a"] == b"offline"
        c2 = MemoryTransport(b.url, "c").connect()  # the same id takes the session over
        assert not c.connected and _drain(c) == [("disconnected", "", b"", False)]
        c2.close()
        assert c2.traffic() == {} and a.traffic()["w/model"] == (3, 4)
    finally:
        b.close()
    with pytest.raises(TransportError):
        MemoryTransport(b.url, "late").connect()  # that broker is gone
