"""The runtime follows signed releases (:mod:`neurofed_runtime.follow`): a :class:`neurofed_runtime.Decoder` swaps
to each accepted release between two windows, no window lost or decoded twice, the session's alignment statistics and
BN context carried; refused releases (forged, replayed, incompatible) keep the running model. No broker here
(tests/runtime/test_follow_mqtt.py subscribes over a real Mosquitto)."""

from __future__ import annotations

import numpy as np
import pytest
from neurofed_runtime import Decoder
from neurofed_runtime import release as rel
from neurofed_runtime.follow import ReleaseFollower, release_topic

from neurofed.broker.protocol import Topics
from tests.release_support import payload

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _decode(path, ch, sf, ws, follower=None, version=None, offers=None):
    """Decode ``ws`` in order; before window i, ``offers[i]`` payloads are offered to the follower."""
    dec = Decoder.load(path, ch_names=ch, sfreq=sf)
    if follower is not None:
        dec.follow(follower, version)
    out = []
    for i, w in enumerate(ws):
        for p in (offers or {}).get(i, ()):
            follower.offer(p)
        out.append(dec.decode(w))
    return dec, out


def test_the_topic_is_the_coordinators():
    assert release_topic("clinic-a") == Topics("clinic-a").release


def test_a_decoder_swaps_between_windows_and_carries_the_session(release_models, release_keys, cue_windows, tmp_path):
    """Windows 0..k-1 by release 1, k.. by release 2 (every window decoded once); after the swap the outputs equal
    release 2 decoding the session from its start (alignment and BN context carried), not release 2 from a fresh
    state."""
    a, b = release_models
    ch, sf, ws = cue_windows
    k = 6
    f = ReleaseFollower(release_keys[0][1], tmp_path)
    dec, out = _decode(a, ch, sf, ws, f, 1, {k: [payload(b, release_keys, 2, 1)]})
    assert len(out) == len(ws) and [r.version for r in out] == [1] * k + [2] * (len(ws) - k)
    assert dec.version == 2 and f.version == 2 and f.current is dec.model
    sw = f.swaps[0]
    assert (sw["version"], sw["previous"], sw["ea_windows_carried"], sw["context_carried"]) == (2, 1, k, True)
    _, ref = _decode(b, ch, sf, ws)  # release 2 from the session's start
    for got, want in zip(out[k:], ref[k:]):
        assert np.allclose(got.probs, want.probs, atol=1e-5)
    _, fresh = _decode(b, ch, sf, ws[k:k + 1])
    assert not np.allclose(fresh[0].probs, out[k].probs, atol=1e-5)


def test_refused_releases_keep_the_running_model(release_models, release_keys, cue_windows, tmp_path):
    """A forged release (valid format, wrong key), a replay of the running version and a tampered payload are each
    refused in one line; the decoder goes on with release 2 for every window."""
    a, b = release_models
    ch, sf, ws = cue_windows
    good = bytearray(payload(a, release_keys, 3, 2))
    good[-50] ^= 1
    bad = [payload(a, release_keys, 3, 2, forged=True), payload(a, release_keys, 2, 1), bytes(good)]
    f = ReleaseFollower(release_keys[0][1], tmp_path)
    dec, out = _decode(b, ch, sf, ws[:6], f, 2, {2: bad})
    assert [r.version for r in out] == [2] * 6 and dec.version == 2 and f.swaps == []
    assert len(f.refused) == 3 and all("\n" not in r for r in f.refused)
    assert "bad signature" in f.refused[0] and "not newer" in f.refused[1]


def test_a_signed_rollback_swaps_back(release_models, release_keys, cue_windows, tmp_path):
    """The publisher's rollback (release 1's bytes signed anew as version 3, ``rollback_of`` 1) is followed; the
    swap record names it."""
    a, b = release_models
    ch, sf, ws = cue_windows
    data = a.read_bytes()
    rollback = rel.pack(data, rel.sign(data, rel.load_private(release_keys[0][0]), 3, 2, rollback_of=1))
    f = ReleaseFollower(release_keys[0][1], tmp_path)
    _, out = _decode(b, ch, sf, ws[:6], f, 2, {3: [rollback]})
    assert [r.version for r in out] == [2, 2, 2, 3, 3, 3]
    assert [(s["previous"], s["version"], s["rollback_of"]) for s in f.swaps] == [(2, 3, 1)]
