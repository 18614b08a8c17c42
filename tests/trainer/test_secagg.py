"""Secure aggregation core: masked inputs hide each update, the sum is exact, dropped clients are recovered."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.fl.secagg import SecAggClient, SecAggError, decode, encode, secure_weighted_mean


def _updates(n=5, d=200, seed=0):
    rng = np.random.default_rng(seed)
    return {c: (rng.normal(0, 0.5, d), int(rng.integers(30, 46))) for c in range(1, n + 1)}


def _plain(updates, keep):
    w = sum(updates[c][1] for c in keep)
    return sum(updates[c][0] * updates[c][1] for c in keep) / w


def test_sum_is_exact_up_to_fixed_point():
    up = _updates()
    got = secure_weighted_mean(up, t=3)
    np.testing.assert_allclose(got, _plain(up, up), atol=5 * 2.0 ** -16)


def test_dropped_clients_are_recovered_and_excluded():
    up = _updates(n=6)
    got = secure_weighted_mean(up, t=3, dropout=[2, 5])
    np.testing.assert_allclose(got, _plain(up, [1, 3, 4, 6]), atol=5 * 2.0 ** -16)


def test_too_few_survivors_cannot_unmask():
    with pytest.raises(SecAggError, match="threshold is 4"):
        secure_weighted_mean(_updates(n=5), t=4, dropout=[1, 2])


def test_a_masked_input_reveals_nothing_of_its_update():
    rid = b"r" * 16
    a, b = SecAggClient(1, rid, np.random.default_rng(1)), SecAggClient(2, rid, np.random.default_rng(2))
    pks = {1: a.public_key(), 2: b.public_key()}
    x = encode(np.zeros(1000), 16)  # an all-zero update
    y = a.masked_input(x, pks)
    assert y.dtype == np.uint32 and not np.array_equal(y, x)
    # the masked values of a zero update look uniform on 32 bits (mean ~2^31, no value repeated much)
    assert abs(y.astype(np.float64).mean() / 2**31 - 1) < 0.1 and len(np.unique(y)) > 990


def test_fixed_point_round_trip_and_overflow():
    x = np.array([-1.5, 0.0, 2.25, 1e-5])
    np.testing.assert_allclose(decode(encode(x, 16), 16), x, atol=2.0 ** -16)
    with pytest.raises(SecAggError, match="too large"):
        encode(np.array([40000.0]), 16)
