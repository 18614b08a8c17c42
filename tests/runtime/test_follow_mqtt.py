"""The runtime's subscriber (:func:`neurofed_runtime.follow.subscribe`, paho-mqtt) over a real Mosquitto: the retained
release reaches a decoder that subscribes after it was published, a newer one arrives live, a forged one published
by another client is refused, and a missing broker is one line."""

from __future__ import annotations

import threading
import time

import pytest
from neurofed_runtime import Decoder
from neurofed_runtime.errors import NeuroFedError
from neurofed_runtime.follow import ReleaseFollower, release_topic, subscribe

from tests.broker.conftest import mosquitto  # noqa: F401 - the fixture
from tests.release_support import payload, publish_retained


def _wait(cond, timeout=20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.05)
    return cond()


def test_follow_releases_over_mosquitto(mosquitto, release_models, release_keys, cue_windows, tmp_path):  # noqa: F811
    a, b = release_models
    ch, sf, ws = cue_windows
    fed = f"rtfollow{time.monotonic_ns() % 10**8}"
    topic = release_topic(fed)
    publish_retained(mosquitto.port, topic, payload(a, release_keys, 1))  # retained before the decoder starts
    f = ReleaseFollower(release_keys[0][1], tmp_path / "in")
    stop = threading.Event()
    th = subscribe(f, f"mqtt://127.0.0.1:{mosquitto.port}", fed, stop, client_id="rt-follow-test")
    try:
        assert _wait(lambda: f.accepted == [1]), f.refused
        dec = Decoder.load(f.take().path, ch_names=ch, sfreq=sf).follow(f, 1)
        first = [dec.decode(w).version for w in ws[:3]]
        publish_retained(mosquitto.port, topic, payload(b, release_keys, 5, 1, forged=True))  # a client with broker credentials
        publish_retained(mosquitto.port, topic, payload(b, release_keys, 2, 1))
        assert _wait(lambda: f.accepted == [1, 2]), f.refused
        rest = [dec.decode(w).version for w in ws[3:6]]
        assert first == [1, 1, 1] and rest == [2, 2, 2]
        assert len(f.refused) == 1 and "bad signature" in f.refused[0]
    finally:
        stop.set()
        th.join(10)


def test_no_broker_is_one_line(release_keys, tmp_path):
    f = ReleaseFollower(release_keys[0][1], tmp_path)
    with pytest.raises(NeuroFedError, match="cannot reach the MQTT broker"):
        subscribe(f, "mqtt://127.0.0.1:1", "fed", threading.Event(), timeout=2)
    with pytest.raises(NeuroFedError, match="not an mqtt"):
        subscribe(f, "http://127.0.0.1:1883", "fed", threading.Event())
