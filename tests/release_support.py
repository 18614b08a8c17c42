"""Shared by the tests that follow signed releases (tests/edge/test_follow*.py, tests/runtime/test_follow*.py): two
standalone exports of different real checkpoints, two key pairs (the federation's and a forger's), raw cue windows of a
real recording, and a signed release payload. The fixtures (tests/conftest.py) are session-scoped: built once per
test worker however many of those files it runs."""

from __future__ import annotations

from pathlib import Path

from neurofed_runtime import release as rel

LABELS = {"T1": "left_fist", "T2": "right_fist"}


def two_standalone_models(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """Standalone exports (160 Hz) of a real checkpoint (seed 0) and another (seed 1), same channels and
    preprocessing."""
    from neurofed.export.standalone import export_standalone
    from tests.export.conftest import exported_eegnet, make_checkpoint
    from tests.shared_once import build_once

    def build(d: Path) -> tuple[Path, Path]:
        ck1 = exported_eegnet(tmp_path_factory, data_dir)[0]
        ck2 = make_checkpoint(d / "m2.safetensors", "eegnet", "batch_specific", data_dir, seed=1)
        a, b = d / "a.onnx", d / "b.onnx"
        export_standalone(ck1, a, rate=160.0)
        export_standalone(ck2, b, rate=160.0)
        return a, b

    a, b = build_once(tmp_path_factory, "follow", build)  # once for all xdist workers
    return a, b


def key_pairs(tmp_path_factory):
    """``((federation key, public key), (forger's key, its public key))``."""
    d = tmp_path_factory.mktemp("fkeys")
    return rel.keygen(d), rel.keygen(d, name="forger")


def cue_windows(data_dir):
    """``(channel names, rate, raw cue-locked windows)``: 64 ch x 640 samples at 160 Hz, microvolts, of S003R04."""
    from neurofed.trainer.data.io import read_raw

    raw = read_raw(data_dir / "eegmmidb" / "S003" / "S003R04.edf")
    data = raw.get_data() * 1e6
    sf = float(raw.info["sfreq"])
    on = [int(round(o * sf)) for o, dsc in zip(raw.annotations.onset, raw.annotations.description) if dsc in LABELS]
    return list(raw.ch_names), sf, [data[:, i:i + 640] for i in on if i + 640 <= data.shape[1]]


def payload(path: Path, keys, version: int, parent: int | None = None, forged: bool = False) -> bytes:
    """The release envelope of ``path`` signed as ``version`` (by the forger's key with ``forged``)."""
    data = path.read_bytes()
    priv = keys[1][0] if forged else keys[0][0]
    return rel.pack(data, rel.sign(data, rel.load_private(priv), version, parent))


def publish_retained(port: int, topic: str, data: bytes) -> None:
    """Publish ``data`` retained (QoS 1) on a broker at 127.0.0.1:``port``, as a client with broker credentials
    would (paho-mqtt)."""
    import time

    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pub-{time.monotonic_ns()}")
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.publish(topic, data, qos=1, retain=True).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()
