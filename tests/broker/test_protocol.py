"""Wire protocol: framing round trips, tamper detection, strict schemas, topics."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from pydantic import ValidationError

from broker.protocol import (
    SCHEMA_VERSION,
    JoinMsg,
    ModelSpec,
    ProtocolError,
    StatusMsg,
    Topics,
    UpdateMsg,
    decode,
    encode,
    new_id,
    pack,
    state_sha256,
    unpack,
)


def _update(**kw):
    base = {"federation": "fed", "sender": "S001", "round": 3, "task_id": new_id(), "n_samples": 45,
            "base_sha256": "a" * 64, "metrics": {"loss": 0.5}}
    base.update(kw)
    return UpdateMsg(**base)


def test_update_round_trip_is_exact():
    tensors = pack({"state": {"w": torch.randn(4, 3), "n": torch.tensor(7)}, "extra": {}})
    payload = encode(_update(), tensors)
    msg, got = decode(payload)
    assert msg.kind == "update" and msg.round == 3 and msg.body_len > 0
    assert got.keys() == tensors.keys()
    assert all(torch.equal(got[k], tensors[k]) for k in tensors)
    assert msg.body_sha256 == state_sha256(tensors)


def test_compressed_frame_round_trips():
    tensors = {"state.w": torch.zeros(1000)}
    small = encode(_update(), tensors, compress=True)
    assert len(small) < len(encode(_update(), tensors))
    _, got = decode(small)
    assert torch.equal(got["state.w"], tensors["state.w"])


def test_tampered_body_is_rejected():
    payload = bytearray(encode(_update(), {"state.w": torch.ones(16)}))
    payload[-3] ^= 0xFF
    with pytest.raises(ProtocolError, match="SHA-256"):
        decode(bytes(payload))


def test_unknown_header_field_and_nan_are_rejected():
    payload = encode(StatusMsg(federation="fed", sender="S001", state="online"))
    hlen = struct.unpack(">I", payload[4:8])[0]
    doc = json.loads(payload[8:8 + hlen])
    for bad in ({**doc, "evil": 1}, {**doc, "sent_at": float("nan")}, {**doc, "v": 1}, {**doc, "sender": "a/b"}):
        raw = json.dumps(bad).encode()
        with pytest.raises(ProtocolError):
            decode(payload[:4] + struct.pack(">I", len(raw)) + raw)


def test_body_rules_and_limits():
    with pytest.raises(ProtocolError, match="needs tensors"):
        encode(_update())
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(encode(_update(), {"state.w": torch.ones(1000)}), max_bytes=100)
    with pytest.raises(ProtocolError, match="magic"):
        decode(b"XX\x01\x00\x00\x00\x00\x02{}")


def test_join_never_carries_samples():
    j = JoinMsg(federation="fed", sender="S001", n_trials=45, n_channels=21, n_times=320, sfreq=80.0,
                classes=["left_fist", "right_fist"])
    with pytest.raises(ProtocolError, match="must not carry"):
        hdr = j.model_copy(update={"body_len": 4, "body_sha256": "0" * 64}).model_dump_json().encode()
        decode(b"NF" + bytes([SCHEMA_VERSION, 0]) + struct.pack(">I", len(hdr)) + hdr + b"abcd")


def test_topics_parse_and_validate():
    t = Topics("demo")
    assert t.update("S001") == "neurofed/demo/update/S001"
    assert t.parse("neurofed/demo/update/S001") == ("update", "S001")
    assert t.parse("neurofed/demo/model") == ("model", None)
    assert t.any_client("status") == "neurofed/demo/status/+"
    for bad in ("neurofed/other/update/S001", "neurofed/demo/update/S001/x", "neurofed/demo/whatever"):
        with pytest.raises(ProtocolError):
            t.parse(bad)
    with pytest.raises(ProtocolError):
        t.update("a/+")


def test_unpack_rejects_unknown_groups():
    assert unpack({"state.a": torch.ones(1)}, ("state", "extra"))["state"].keys() == {"a"}
    with pytest.raises(ProtocolError):
        unpack({"evil.a": torch.ones(1)}, ("state", "extra"))


def test_model_spec_is_strict():
    with pytest.raises(ValidationError):
        ModelSpec(model="resnet", n_channels=21, n_classes=2, n_times=320, sfreq=80, bn_mode="standard",
                  ch_names=[], classes=[])


def test_a_peer_of_another_schema_version_gets_a_clear_error():
    """Schema 2 added device profiles, secure aggregation and cached extras: a v1 frame is refused by name."""
    frame = encode(_update(), {"state.w": torch.ones(3)})
    old = frame[:2] + bytes([1]) + frame[3:]
    with pytest.raises(ProtocolError, match=f"unsupported schema version 1 \\(this build speaks {SCHEMA_VERSION}\\)"):
        decode(old)


def test_model_spec_is_modelmeta_s_model_fields(tmp_path):
    """One description: the wire spec's fields, types and defaults are ModelMeta's; a checkpoint written
    from a spec reads back as the same spec."""
    import dataclasses
    import typing

    import broker.protocol as proto
    from trainer.checkpoint import MODEL_FIELDS, ModelMeta, meta_fields, read_meta, save_checkpoint

    assert tuple(ModelSpec.model_fields)[:len(MODEL_FIELDS)] == MODEL_FIELDS  # + the wire-only device profiles
    for name, (hint, default) in meta_fields(MODEL_FIELDS).items():
        assert proto._kind(ModelSpec.model_fields[name].annotation) is (typing.get_origin(hint) or hint)
        assert ModelSpec.model_fields[name].is_required() == (default is ...)
    spec = ModelSpec(model="eegnet", n_channels=2, n_classes=2, n_times=64, sfreq=80.0, bn_mode="batch_specific",
                     ch_names=["C3", "C4"], classes=["left", "right"], preprocess={"ea": True}, strategy="fedbs")
    path = save_checkpoint(tmp_path / "m.safetensors", {"w": torch.zeros(1)}, spec.to_meta(8, {"round": 3}))
    meta = read_meta(path)
    assert isinstance(meta, ModelMeta) and meta.extra == {"round": 3} and meta.test_batch_size == 8
    assert ModelSpec.from_meta(meta) == spec
    with pytest.raises(ValidationError):  # the wire bounds still apply to a checkpoint's description
        ModelSpec.from_meta(dataclasses.replace(meta, n_classes=1))


def test_model_bounds_must_match_modelmeta(monkeypatch):
    import broker.protocol as proto

    monkeypatch.setitem(proto.MODEL_BOUNDS, "n_channels", str)
    with pytest.raises(TypeError, match="n_channels"):
        proto._model_fields()
    monkeypatch.delitem(proto.MODEL_BOUNDS, "n_channels")
    with pytest.raises(TypeError, match="MODEL_FIELDS"):
        proto._model_fields()
