"""Following signed releases on plain arrays (no broker): refusals keep the model, a swap happens between two windows
and carries the session's alignment statistics (neurofed.edge.follow)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from neurofed_runtime import release as rel

from neurofed.edge.follow import ReleaseFollower, carry_state
from neurofed.edge.infer import InferenceEngine, Prediction, StandaloneStep
from neurofed.export.decoder import StandaloneModel
from tests.release_support import payload

torch.set_num_threads(1)


def _engine(path, ch, sf):
    m = StandaloneModel(path)
    return m, InferenceEngine(m, ch, sf, decoder=StandaloneStep(m, sf))


def test_refusals_keep_the_running_model(release_models, release_keys, tmp_path, caplog):
    a, b = release_models
    cur = StandaloneModel(a)
    f = ReleaseFollower(release_keys[0][1], tmp_path, StandaloneModel, version=1, current=cur)
    good = payload(b, release_keys, 2, 1)
    with caplog.at_level(logging.WARNING, logger="neurofed.edge"):
        assert f.offer(payload(b, release_keys, 5, 1, forged=True)) is None          # valid format, wrong key
        assert f.offer(payload(b, release_keys, 1)) is None                          # equal version
        tampered = bytearray(good)
        tampered[-100] ^= 1
        assert f.offer(bytes(tampered)) is None                               # bytes changed after signing
        assert f.offer(b"NF\x03\x08junk") is None                             # not a release at all
        assert f.offer(good, "t") is not None
        assert f.offer(payload(a, release_keys, 2, 1)) is None                       # same version again: older-or-equal
    assert len(f.refused) == 5 and all("\n" not in r for r in f.refused)
    assert "bad signature" in f.refused[0] and "not newer" in f.refused[1] and "sha256" in f.refused[2]
    assert "bad magic" in f.refused[3] and "not newer" in f.refused[4]
    assert sum("release refused, decoder keeps its model" in r.message for r in caplog.records) == 5


def test_incompatible_release_is_refused(release_models, release_keys, tmp_path):
    """A release whose graph decodes other channels cannot replace the running model (one line)."""
    from tests.runtime.conftest import with_card

    a, b = release_models
    # a release whose card names other classes than the running model's
    other = with_card(b, tmp_path / "other.onnx", classes=["left", "right"])
    f = ReleaseFollower(release_keys[0][1], tmp_path / "in", StandaloneModel, version=1, current=StandaloneModel(a))
    assert f.offer(payload(other, release_keys, 2, 1)) is None
    assert "cannot replace the running model" in f.refused[0] and "classes" in f.refused[0]


def test_swap_between_windows_carries_alignment(release_models, release_keys, cue_windows, tmp_path):
    """Windows 0..k-1 with release 1, then release 2: no window lost, later windows stamped 2, and release 2's
    outputs after the swap equal release 2 run from the session's start (EA statistics and BN context carried)."""
    a, b = release_models
    ch, sf, ws = cue_windows
    k = 7
    ma, eng = _engine(a, ch, sf)
    eng.model_version = 1
    f = ReleaseFollower(release_keys[0][1], tmp_path, StandaloneModel, version=1, current=ma)
    out = []
    for i, w in enumerate(ws):
        if i == k:
            assert f.offer(payload(b, release_keys, 2, 1)) is not None
        f.apply(eng)
        out.append(eng.process(w, float(i)))
    assert len(out) == len(ws) and all(isinstance(r, Prediction) for r in out)
    assert [r.model_version for r in out] == [1] * k + [2] * (len(ws) - k)
    sw = f.swaps[0]
    assert len(f.swaps) == 1 and sw["received_to_swap_ms"] >= sw["verify_load_ms"] > 0
    assert {k_: sw[k_] for k_ in ("version", "previous", "ea_windows_carried", "context_carried")} == {
        "version": 2, "previous": 1, "ea_windows_carried": k, "context_carried": True}
    _, ref = _engine(b, ch, sf)  # release 2 from the start of the session
    ref_out = [ref.process(w, float(i)) for i, w in enumerate(ws)]
    for got, want in zip(out[k:], ref_out[k:]):
        assert np.allclose(got.probabilities, want.probabilities, atol=1e-5)
        assert got.ea_windows == want.ea_windows
    # and not what release 2 would give from a fresh state at the swap (the carry matters)
    _, fresh = _engine(b, ch, sf)
    first = fresh.process(ws[k], 0.0)
    assert not np.allclose(first.probabilities, out[k].probabilities, atol=1e-5)


def test_signed_rollback_swaps_back_and_forged_or_replayed_ones_are_refused(release_models, release_keys, cue_windows, tmp_path):
    """Running release 2 (model B): a replay of genuine release 1 and a forged rollback (wrong key, version 3,
    ``rollback_of`` 1) are refused; the publisher's rollback (model A's bytes signed anew as version 3, parent 2,
    ``rollback_of`` 1) swaps the decoder back to model A between two windows, its outputs those of A continuing the
    session (alignment carried), and a later replay of release 2 is refused too."""
    a, b = release_models
    ch, sf, ws = cue_windows
    k = 5
    mb, eng = _engine(b, ch, sf)
    eng.model_version = 2
    f = ReleaseFollower(release_keys[0][1], tmp_path, StandaloneModel, version=2, current=mb)
    data = a.read_bytes()
    rollback = rel.pack(data, rel.sign(data, rel.load_private(release_keys[0][0]), 3, 2, rollback_of=1))
    forged = rel.pack(data, rel.sign(data, rel.load_private(release_keys[1][0]), 3, 2, rollback_of=1))
    out = []
    for i, w in enumerate(ws):
        if i == k:
            assert f.offer(payload(a, release_keys, 1)) is None          # genuine release 1 replayed: older
            assert f.offer(forged) is None                        # valid format, wrong key
            assert f.offer(rollback) is not None
        if i == k + 2:
            assert f.offer(payload(b, release_keys, 2, 1)) is None       # genuine release 2 replayed after the rollback
        f.apply(eng)
        out.append(eng.process(w, float(i)))
    assert [r.model_version for r in out] == [2] * k + [3] * (len(ws) - k)
    assert len(f.refused) == 3 and "not newer" in f.refused[0] and "bad signature" in f.refused[1]
    assert "not newer" in f.refused[2]
    assert [(s["previous"], s["version"], s["rollback_of"]) for s in f.swaps] == [(2, 3, 1)]
    _, ref = _engine(a, ch, sf)  # model A from the start of the session
    ref_out = [ref.process(w, float(i)) for i, w in enumerate(ws)]
    for got, want in zip(out[k:], ref_out[k:]):
        assert np.allclose(got.probabilities, want.probabilities, atol=1e-5)


def test_carry_state_keeps_model_hash_of_the_new_model(release_models):
    a, b = release_models
    ma, mb = StandaloneModel(a), StandaloneModel(b)
    s = ma.initial_state() + 0.0
    s[3:] = 7.0
    out, ctx = carry_state(ma, mb, s)  # no recent windows to rebuild the new graph's context from
    assert np.array_equal(out[:3], mb.initial_state()[:3]) and not np.array_equal(out[:3], s[:3])
    assert not ctx


def test_follow_refuses_an_unsigned_or_foreign_starting_model(release_models, release_keys, tmp_path):
    """``infer --follow --model M``: the starting model must verify too (checked before any broker or stream)."""
    from rich.console import Console

    from neurofed.edge.infer_cli import _start_follow
    from neurofed.trainer.errors import NeuroFedError

    a, _ = release_models
    m = tmp_path / "start.onnx"
    m.write_bytes(a.read_bytes())
    args = ("mqtt://127.0.0.1:1", "fed", tmp_path / "in", 1.0, None, Console())
    with pytest.raises(NeuroFedError, match="signature file not found"):
        _start_follow([m], release_keys[0][1], *args)
    rel.sig_path(m).write_text(__import__("json").dumps(rel.sign(m.read_bytes(), rel.load_private(release_keys[1][0]), 1)))
    with pytest.raises(NeuroFedError, match="bad signature"):
        _start_follow([m], release_keys[0][1], *args)
    with pytest.raises(NeuroFedError, match="--follow needs --pub"):
        _start_follow([m], None, *args)
