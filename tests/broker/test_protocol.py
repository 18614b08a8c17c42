"""Wire protocol: framing round trips, tamper detection, strict schemas, topics."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from pydantic import ValidationError

from neurofed.broker.protocol import (
    SCHEMA_VERSION,
    JoinMsg,
    ModelSpec,
    ProtocolError,
    StatusMsg,
    Topics,
    UpdateMsg,
    decode,
    encode,
    encode_header,
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


def _frame(header: bytes, flags: int = 0, body: bytes = b"") -> bytes:
    return b"NF" + bytes([SCHEMA_VERSION, flags]) + struct.pack(">I", len(header)) + header + body


def test_unknown_header_field_and_nan_are_rejected():
    doc = json.loads(encode_header(StatusMsg(federation="fed", sender="S001", state="online")))
    assert decode(_frame(json.dumps(doc).encode()))[0].state == "online"  # a plain (not deflated) header is fine
    for bad in ({**doc, "evil": 1}, {**doc, "sent_at": float("nan")}, {**doc, "v": 2}, {**doc, "sender": "a/b"},
                {k: v for k, v in doc.items() if k != "kind"}):
        raw = json.dumps(bad).encode()
        with pytest.raises(ProtocolError):
            decode(_frame(raw))


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


@pytest.mark.parametrize("old", [1, 2])
def test_a_peer_of_another_schema_version_gets_a_clear_error(old):
    """Schema 2 added device profiles, secure aggregation and cached extras, schema 3 compact deflated headers
    and shuffled / word-delta bodies: a v1 or v2 frame is refused by name (a v2 frame as a v2 peer sends it)."""
    assert SCHEMA_VERSION == 3
    hdr = _update().model_dump_json(exclude_none=False).replace('"v":3', f'"v":{old}').encode()
    frame = b"NF" + bytes([old, 0]) + struct.pack(">I", len(hdr)) + hdr
    with pytest.raises(ProtocolError, match=f"unsupported schema version {old} \\(this build speaks 3\\)"):
        decode(frame)


def test_model_spec_is_modelmeta_s_model_fields(tmp_path):
    """One description: the wire spec's fields, types and defaults are ModelMeta's; a checkpoint written
    from a spec reads back as the same spec."""
    import dataclasses
    import typing

    import neurofed.broker.protocol as proto
    from neurofed.trainer.checkpoint import MODEL_FIELDS, ModelMeta, meta_fields, read_meta, save_checkpoint

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
    import neurofed.broker.protocol as proto

    monkeypatch.setitem(proto.MODEL_BOUNDS, "n_channels", str)
    with pytest.raises(TypeError, match="n_channels"):
        proto._model_fields()
    monkeypatch.delitem(proto.MODEL_BOUNDS, "n_channels")
    with pytest.raises(TypeError, match="MODEL_FIELDS"):
        proto._model_fields()


# ----------------------------------------------------------------------------- schema 3: compact headers, coded bodies
def _examples():
    """One message of every kind, with and without optional parts (nested specs, None fields, empty containers)."""
    from neurofed.broker.protocol import (
        ErrorMsg,
        ExtrasMsg,
        ModelMsg,
        ResultMsg,
        SaInboxMsg,
        SaKeysMsg,
        SaMaskedMsg,
        SaRevealMsg,
        SaRosterMsg,
        SaSharesMsg,
        SaUnmaskMsg,
        SecAggSpec,
        TaskMsg,
    )

    env = {"federation": "fed", "sender": "coordinator", "run_id": new_id()}
    sa = {**env, "round": 2, "task_id": new_id()}
    spec = ModelSpec(model="eegnet", n_channels=2, n_classes=2, n_times=64, sfreq=80.0, bn_mode="standard",
                     ch_names=["C3", "C4"], classes=["left", "right"], preprocess={"ea": True, "fmin": 8.0},
                     strategy="fedavg")
    w = {"w": torch.randn(5, 3)}
    return [
        (JoinMsg(federation="fed", sender="S001", n_trials=45, n_channels=21, n_times=320, sfreq=80.0,
                 classes=["a", "b"], capabilities={"torch": "2.4", "threads": 1}), None),
        (StatusMsg(federation="fed", sender="S001", state="online"), None),  # round None, run_id ""
        (StatusMsg(federation="fed", sender="S001", state="done", round=0, run_id=new_id()), None),
        (TaskMsg(**env, round=0, rounds_total=3, task_id=new_id(), selected=["S001", "S002"], deadline_s=60, seed=0,
                 strategy="fedavg", local={"lr": 0.05}, compress=True, model_sha256="a" * 64), None),
        (TaskMsg(**env, round=1, rounds_total=3, task_id=new_id(), selected=["S001"], deadline_s=60, seed=7,
                 strategy="scaffold", strategy_overrides={"mu": 0.1}, profiles={"S001": "p1"},
                 profile_models={"p1": "b" * 64}, extras_sha256="c" * 64,
                 secagg=SecAggSpec(neighbours=0, threshold=0.5, bound=8.0, n_ref=90)), {"extra.c": torch.ones(3)}),
        (_update(run_id=env["run_id"]), pack({"state": w, "extra": {}})),
        (ErrorMsg(federation="fed", sender="S001", code="task_failed", message="x", round=None), None),
        (ResultMsg(**env, round=1, participants=[], rejected=0, bytes_down=1, bytes_up=2, seconds=0.5, loss=None,
                   model_sha256="d" * 64), None),
        (ModelMsg(**env, round=0, meta=spec), w),
        (ModelMsg(**env, round=3, final=True, meta=spec.model_copy(update={"profile": "p1", "profiles": [{"name": "p1"}]})), w),
        (ExtrasMsg(**env, round=1), w),
        (SaKeysMsg(**{**sa, "sender": "S001"}, channel_pk="A" * 43 + "=", mask_pk="B" * 43 + "="), None),
        (SaRosterMsg(**sa, size=3, index=1, graph_seed=5, neighbours=2, threshold=2, keys="QUJDRA=="), None),
        (SaSharesMsg(**{**sa, "sender": "S001"}, shares="QUJDRA=="), None),
        (SaInboxMsg(**sa, senders=[2], shares="QUJDRA=="), None),
        (SaMaskedMsg(**{**sa, "sender": "S001"}), {"masked": torch.arange(10, dtype=torch.int32)}),
        (SaUnmaskMsg(**sa, survivors=[2], dropped=[]), None),
        (SaRevealMsg(**{**sa, "sender": "S001"}, b_shares="", key_shares="QUJDRA=="), None),
    ]


@pytest.mark.parametrize("i", range(18))
def test_every_header_kind_round_trips_without_its_default_fields(i):
    """Schema 3 leaves fields at their default (None, "", 0, empty, False) off the wire; decoding fills them in."""
    msg, tensors = _examples()[i]
    for compress in (False, True):
        got, back = decode(encode(msg, tensors, compress=compress))
        assert got == msg.model_copy(update={"body_len": got.body_len, "body_sha256": got.body_sha256})
        assert type(got) is type(msg) and got.msg_id == msg.msg_id and got.sent_at == msg.sent_at
        assert (back is None) == (tensors is None)
        assert back is None or all(torch.equal(back[k], tensors[k]) for k in tensors)
    doc = json.loads(encode_header(msg))
    assert {"kind", "msg_id", "sent_at"} <= doc.keys() and "v" not in doc
    for k, v in doc.items():  # besides kind/msg_id/sent_at: required fields, and optional ones not at their default
        field = type(msg).model_fields[k]
        assert k in ("kind", "msg_id", "sent_at") or field.is_required() or v != field.get_default(
            call_default_factory=True), k


def test_compact_header_is_what_the_schema_fills_back():
    task = _examples()[3][0]
    doc = json.loads(encode_header(task))
    assert not {"secagg", "profiles", "profile_models", "strategy_overrides", "extras_sha256", "body_len"} & doc.keys()
    full = json.loads(task.model_dump_json())
    assert {k: v for k, v in full.items() if k in doc} == doc  # the values that are sent are sent as before
    # a header with every field written out (as schema 2 sent it) still decodes to the same message
    raw = task.model_dump_json(exclude_none=False).encode()
    assert decode(_frame(raw))[0] == task


def test_header_dictionary_is_pinned():
    """HEADER_DICT is part of the wire format: changing it is a schema change (bump SCHEMA_VERSION, then this hash)."""
    import hashlib

    from neurofed.broker.protocol import HEADER_DICT

    assert SCHEMA_VERSION == 3
    assert hashlib.sha256(HEADER_DICT).hexdigest() == HEADER_DICT_SHA256


HEADER_DICT_SHA256 = "20faa6c3ef840d560de4395acaf8a44aba6ba0f65b51bbf28b5531a4d68036b7"


def test_bad_compressed_header_and_body_are_refused():
    from neurofed.broker.protocol import FLAG_HEADER, FLAG_LZMA, MAX_HEADER_BYTES, compress_body

    good = encode(_update(), {"state.w": torch.ones(16)}, compress=True)
    hlen = struct.unpack(">I", good[4:8])[0]
    with pytest.raises(ProtocolError, match="compressed header"):
        decode(good[:8] + bytes(hlen) + good[8 + hlen:])  # not a deflate stream
    with pytest.raises(ProtocolError, match="truncated"):
        decode(good[:4] + struct.pack(">I", hlen - 3) + good[8:8 + hlen - 3] + good[8 + hlen:])
    import zlib

    from neurofed.broker.protocol import HEADER_DICT

    c = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, HEADER_DICT)
    bomb = c.compress(b" " * (MAX_HEADER_BYTES + 10)) + c.flush()
    with pytest.raises(ProtocolError, match="expands beyond"):
        decode(_frame(bomb, FLAG_HEADER))
    body_bomb = compress_body(b"\x00" * (1 << 20))
    with pytest.raises(ProtocolError, match="expands beyond its declared length"):
        decode(good[:3] + bytes([good[3] | FLAG_LZMA]) + good[4:8 + hlen] + body_bomb)
    with pytest.raises(ProtocolError, match="corrupt|truncated"):
        decode(good[:-5])
    with pytest.raises(ProtocolError, match="unknown frame flags"):
        decode(good[:3] + bytes([0x10]) + good[4:])


def test_body_coding_is_lossless_on_any_bytes():
    """shuffle / delta_code invert exactly for every length and content, incl. a lying safetensors header length."""
    import numpy as np

    from neurofed.broker.protocol import delta_code, delta_decode, shuffle, unshuffle

    rng = np.random.default_rng(0)
    for n in [*range(70), 1001, 4099, 65_543]:
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        ref = rng.integers(0, 256, max(n - 3, 0), dtype=np.uint8).tobytes()
        small_hdr = (max(n - 8, 0) // 3).to_bytes(8, "little") + b[8:] if n >= 8 else b
        for x in (b, small_hdr):
            assert unshuffle(shuffle(x)) == x and len(shuffle(x)) == len(x)
            for r in (ref, x + b"xyz", ref[:5], b""):
                assert delta_decode(delta_code(x, r), r) == x
                assert unshuffle(shuffle(delta_code(x, r))) == delta_code(x, r)


def test_model_and_update_bodies_shrink_and_decode_exactly():
    """The retained model (shuffled + LZMA2) and an update (word delta against the model + shuffled + LZMA2):
    exact round trips, each smaller than plain zlib of the same safetensors bytes (the schema-2 model coding)."""
    import zlib

    from neurofed.broker.protocol import ModelMsg, delta_reference, tensors_to_bytes

    torch.manual_seed(0)
    glob = {"conv.weight": 0.1 * torch.randn(16, 1, 21, 1), "fc.weight": 0.05 * torch.randn(2, 160),
            "bn.running_var": 1 + 0.1 * torch.rand(16), "bn.num_batches_tracked": torch.tensor(40)}
    spec = ModelSpec(model="eegnet", n_channels=21, n_classes=2, n_times=320, sfreq=80.0, bn_mode="standard",
                     ch_names=[], classes=["a", "b"])
    model = encode(ModelMsg(federation="fed", sender="coordinator", round=1, meta=spec), glob, compress=True)
    msg, got = decode(model)
    assert all(torch.equal(got[k], glob[k]) for k in glob) and msg.body_sha256 == state_sha256(glob)
    hlen = struct.unpack(">I", model[4:8])[0]
    assert len(model) - 8 - hlen < len(zlib.compress(tensors_to_bytes(glob), 6))
    trained = {k: v + 1e-3 * torch.randn(v.shape) if v.is_floating_point() else v + 5 for k, v in glob.items()}
    ref = delta_reference(glob)
    up = encode(_update(), pack({"state": trained}), compress=True, reference=ref)
    _, back = decode(up, reference=ref)
    assert all(torch.equal(back[f"state.{k}"], trained[k]) for k in trained)
    raw = tensors_to_bytes(pack({"state": trained}))
    assert len(up) - 8 - struct.unpack(">I", up[4:8])[0] < 0.8 * len(zlib.compress(raw, 6))
    with pytest.raises(ProtocolError, match="SHA-256"):  # decoded against another model: caught by the body hash
        decode(up, reference=delta_reference(trained))


# ----------------------------------------------------------------------------- issue 54: bounded bodies
def bomb(msg, declared: int, zeros: int, flags: int | None = None) -> bytes:
    """A frame whose header declares a ``declared``-byte body and whose body is ``zeros`` zero bytes, bit-shuffled
    and LZMA2-compressed (a compression bomb: 256 MiB is a 39 kB frame); the hash is of nothing it decodes to."""
    from neurofed.broker.protocol import (
        _PREFIX,
        FLAG_HEADER,
        FLAG_LZMA,
        FLAG_SHUFFLE,
        MAGIC,
        _deflate_header,
        compress_body,
    )

    header = _deflate_header(encode_header(msg.model_copy(update={"body_len": declared, "body_sha256": "0" * 64})))
    f = FLAG_HEADER | FLAG_LZMA | FLAG_SHUFFLE if flags is None else flags
    return _PREFIX.pack(MAGIC, SCHEMA_VERSION, f, len(header)) + header + compress_body(bytes(zeros))


def test_a_declared_body_over_the_cap_is_refused_before_any_decompression(monkeypatch):
    import neurofed.broker.protocol as proto

    def no_decompression(*a, **k):
        raise AssertionError("decompressed a body whose declared length exceeds the cap")

    monkeypatch.setattr(proto, "decompress_body", no_decompression)
    for declared in (256 << 20, proto.DEFAULT_MAX_BODY_BYTES + 1, 2**62):
        with pytest.raises(ProtocolError, match="exceeds the cap of"):
            decode(bomb(_update(), declared, 1 << 16))  # the default cap (a caller that does not know the model)
    with pytest.raises(ProtocolError, match=r"update body declared as 4097 bytes exceeds the cap of 4096"):
        decode(bomb(_update(), 4097, 1 << 16), max_body=4096)
    caps = {"update": 10_000}
    with pytest.raises(ProtocolError, match="exceeds the cap of 10000"):
        decode(bomb(_update(), 10_001, 100), max_body=lambda m: caps[m.kind])
    # a bodiless kind declaring a body is refused before decompression too
    with pytest.raises(ProtocolError, match="must not carry a body"):
        decode(bomb(StatusMsg(federation="fed", sender="S001", state="online"), 1000, 1000))


def test_a_body_decompressing_past_its_small_declared_length_stops_at_the_cap():
    import tracemalloc

    frame = bomb(_update(), 1000, 64 << 20)  # says 1 kB, inflates to 64 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="expands beyond its declared length"):
            decode(frame, max_body=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the decompressor stopped at 1001 bytes (the frame itself is 10 kB)


def test_garbage_and_nested_compression_is_refused_cleanly():
    from neurofed.broker.protocol import FLAG_HEADER, FLAG_LZMA, compress_body

    good = encode(_update(), {"state.w": torch.ones(4096)}, compress=True)
    hlen = struct.unpack(">I", good[4:8])[0]
    head = good[:8 + hlen]
    inner = compress_body(bytes(32 << 20))  # a bomb inside the (honestly sized) body: decoded once, never again
    nested = compress_body(inner)
    for body in (nested, b"\xff" * 4000, bytes(4000), compress_body(b"x" * 100) + b"trailing", inner[:-10]):
        with pytest.raises(ProtocolError):
            decode(head + body, max_body=1 << 20)
    honest_len = decode(good)[0].body_len
    payload = head[:3] + bytes([FLAG_HEADER | FLAG_LZMA]) + head[4:] + nested
    with pytest.raises(ProtocolError):  # declared length honest-looking, content a nested bomb: hash or length fails
        decode(payload, max_body=honest_len)


def test_many_small_bomb_frames_each_cost_at_most_the_cap():
    import time
    import tracemalloc

    frame = bomb(_update(), 1 << 30, 1 << 24)  # each declares 1 GiB, inflates to 16 MiB
    small = bomb(_update(), 1 << 19, 1 << 24)  # declares 512 kB (under the cap), inflates to 16 MiB
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        for _ in range(200):
            with pytest.raises(ProtocolError, match="exceeds the cap"):
                decode(frame, max_body=1 << 20)
        for _ in range(20):
            with pytest.raises(ProtocolError, match="expands beyond"):
                decode(small, max_body=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert time.perf_counter() - t0 < 20


def test_body_cap_bounds_the_real_update_and_unshuffle_is_chunked():
    from neurofed.broker.protocol import body_cap, shuffle, tensors_to_bytes, unshuffle
    from neurofed.trainer.fl.api import tensor_specs
    from neurofed.trainer.models import build_model

    state = build_model("eegnet", 22, 4, 481, 160.0, "standard").state_dict()
    body = tensors_to_bytes(pack({"state": state, "extra": {"c": torch.zeros(3, 5)}}))
    cap = body_cap(state, tensor_specs({"c": torch.zeros(3, 5)}))
    assert len(body) <= cap < len(body) + (128 << 10)
    msg, got = decode(encode(_update(), pack({"state": state}), compress=True), max_body=cap)
    assert got.keys() == pack({"state": state}).keys()
    import numpy as np

    import neurofed.broker.protocol as proto

    x = (0).to_bytes(8, "little") + np.random.default_rng(1).integers(
        0, 256, 4 * proto._UNSHUFFLE_CHUNK_WORDS * 2 + 4 * 40 + 3, dtype=np.uint8).tobytes()
    assert unshuffle(shuffle(x)) == x  # several chunks and a partial one
