"""Label-free test-time adaptation (neurofed.trainer.tta): causality, no labels, safeguards, no-op when off."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from neurofed.trainer.models.eegnet import EEGNet
from neurofed.trainer.tta import MAX_STEPS, CollapseGuard, TTAConfig, decode_stream

N_CH, N_T, N_WIN = 4, 64, 24


def _model(bn_mode: str = "batch_specific", seed: int = 0) -> EEGNet:
    torch.manual_seed(seed)
    m = EEGNet(N_CH, 2, N_T, 32.0, bn_mode=bn_mode)
    if bn_mode == "standard":  # non-trivial running statistics
        m.train()
        with torch.no_grad():
            for _ in range(5):
                m(torch.randn(16, N_CH, N_T) * 2 + 0.5)
    return m.eval()


def _windows(seed: int = 1, n: int = N_WIN) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(N_CH, N_CH))
    return (np.einsum("cd,ndt->nct", mix, rng.normal(size=(n, N_CH, N_T))) + 0.3).astype(np.float32)


TENT = TTAConfig(entropy=True, lr=0.05)
#: every decoder; the entropy ones with a threshold every window passes, so that they do take steps
ALL = [TTAConfig(bn="context"), TTAConfig(), TTAConfig(entropy=True, lr=0.05, max_entropy=1.0),
       TTAConfig(entropy=True, lr=0.05, max_entropy=1.0, diversity=1.0)]


@pytest.mark.parametrize("cfg", ALL, ids=["context", "adabn", "tent", "im"])
@pytest.mark.parametrize("ea_online", [False, True])
def test_prediction_of_window_t_ignores_later_windows(cfg: TTAConfig, ea_online: bool) -> None:
    model, X = _model(), _windows()
    full = decode_stream(model, X, cfg, ea_online)
    other = X.copy()
    t = 10
    other[t:] = _windows(seed=7, n=N_WIN - t) * 5.0  # a different future
    alt = decode_stream(model, other, cfg, ea_online)
    assert (full.updates > 0) == cfg.entropy
    np.testing.assert_array_equal(full.probs[:t], alt.probs[:t])
    assert not np.allclose(full.probs[t:], alt.probs[t:])
    # and the prefix alone decodes the same as the prefix of the whole stream
    np.testing.assert_array_equal(decode_stream(model, X[:t], cfg, ea_online).probs, full.probs[:t])


def test_no_label_reaches_the_decoder() -> None:
    params = set(inspect.signature(decode_stream).parameters)
    assert params == {"model", "X", "cfg", "ea_online"}  # the windows alone: nothing to read a label from


@pytest.mark.parametrize("cfg", ALL, ids=["context", "adabn", "tent", "im"])
def test_source_model_is_never_modified(cfg: TTAConfig) -> None:
    model = _model("standard")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    decode_stream(model, _windows(), cfg)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_disabled_is_the_deployed_decoder() -> None:
    """bn='context' (the default: no adaptation) is batch-specific BN over the window and the 7 before it."""
    model, X = _model(), _windows()
    res = decode_stream(model, X)
    with torch.no_grad():
        ref = [torch.softmax(model(torch.as_tensor(X[max(0, t - 7) : t + 1]))[-1], -1).numpy() for t in range(len(X))]
    np.testing.assert_allclose(res.probs, np.stack(ref), rtol=0, atol=1e-6)
    assert res.updates == 0 and res.resets == [] and res.skipped == 0
    std = _model("standard")  # standard BN: the model's own running statistics, window by window
    with torch.no_grad():
        ref = torch.softmax(std(torch.as_tensor(X)), -1).numpy()
    np.testing.assert_allclose(decode_stream(std, X).probs, ref, rtol=0, atol=1e-6)


def test_adaptive_bn_statistics() -> None:
    model, X = _model(), _windows()
    # momentum 1: only the current window's moments = batch-specific BN over one window
    one = decode_stream(model, X, TTAConfig(momentum=1.0))
    np.testing.assert_allclose(one.probs, decode_stream(model, X, TTAConfig(bn="context", context=1)).probs,
                               rtol=0, atol=1e-5)
    # the first window has only itself either way; later ones differ from the 8-window context
    ada = decode_stream(model, X, TTAConfig())
    ctx = decode_stream(model, X, TTAConfig(bn="context"))
    np.testing.assert_allclose(ada.probs[0], ctx.probs[0], rtol=0, atol=1e-5)
    assert not np.allclose(ada.probs[8:], ctx.probs[8:])
    # standard BN with an overwhelming prior: the source statistics, i.e. the plain model
    std = _model("standard")
    frozen = decode_stream(std, X, TTAConfig(prior_windows=1e12, momentum=1e-12))
    np.testing.assert_allclose(frozen.probs, decode_stream(std, X).probs, rtol=0, atol=1e-5)
    moved = decode_stream(std, X, TTAConfig(prior_windows=1.0))
    assert not np.allclose(moved.probs, frozen.probs)


def test_entropy_minimisation_updates_and_is_seeded() -> None:
    model, X = _model(), _windows()
    a = decode_stream(model, X, replace_cfg(TENT, max_entropy=1.0))
    b = decode_stream(model, X, replace_cfg(TENT, max_entropy=1.0))
    np.testing.assert_array_equal(a.probs, b.probs)
    assert a.updates > 0
    assert not np.allclose(a.probs, decode_stream(model, X, TTAConfig()).probs)


def replace_cfg(cfg: TTAConfig, **kw: object) -> TTAConfig:
    from dataclasses import replace

    return replace(cfg, **kw)


def test_uncertain_windows_are_skipped() -> None:
    """No window under the entropy threshold: no step is taken, the result is adaptive BN alone."""
    model, X = _model(), _windows()
    res = decode_stream(model, X, replace_cfg(TENT, max_entropy=1e-9))
    assert res.updates == 0 and res.skipped == len(X)
    np.testing.assert_array_equal(res.probs, decode_stream(model, X, TTAConfig()).probs)
    lr0 = decode_stream(model, X, replace_cfg(TENT, lr=0.0, max_entropy=1.0))  # steps of size 0 change nothing
    np.testing.assert_allclose(lr0.probs, decode_stream(model, X, TTAConfig()).probs, rtol=0, atol=1e-6)


def test_collapse_guard() -> None:
    g = CollapseGuard(2, momentum=0.2, warmup=4, min_marginal=0.4, min_entropy=0.1)
    assert not any(g.observe(np.array([0.5, 0.5])) for _ in range(50))  # uncertain and balanced: fine
    g.reset()
    fired = [g.observe(np.array([0.97, 0.03])) for _ in range(20)]  # everything one class
    assert not any(fired[:3])  # not during warm-up
    assert any(fired) and g.marginal[1] < 0.2
    g.reset()
    confident = [np.array([1 - 1e-6, 1e-6]), np.array([1e-6, 1 - 1e-6])]  # balanced, but entropy collapsed
    fired = [g.observe(confident[i % 2]) for i in range(40)]
    assert any(fired) and g.marginal.min() > 0.2 and g.entropy < 0.1 * np.log(2)


def test_collapse_resets_to_the_source() -> None:
    model, X = _model(), _windows(n=40)
    # a runaway step size collapses the predictions; the guard resets
    wild = replace_cfg(TENT, lr=50.0, max_entropy=1.0, guard_warmup=4)
    res = decode_stream(model, X, wild)
    assert res.updates > 0 and len(res.resets) > 0
    unguarded = decode_stream(model, X, replace_cfg(wild, min_marginal=0.0, min_entropy=0.0))
    assert unguarded.resets == []
    # a guard that fires at every window resets before any step: exactly the source affine parameters throughout
    always = decode_stream(model, X, replace_cfg(wild, guard_warmup=1, min_marginal=0.999999))
    assert always.updates == 0 and always.resets == list(range(len(X)))
    np.testing.assert_array_equal(always.probs, decode_stream(model, X, TTAConfig()).probs)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="steps"):
        TTAConfig(entropy=True, steps=MAX_STEPS + 1)
    with pytest.raises(ValueError, match="adaptive"):
        TTAConfig(bn="context", entropy=True)
    with pytest.raises(ValueError, match="bn must be"):
        TTAConfig(bn="running")
    with pytest.raises(ValueError, match="windows"):
        decode_stream(_model(), np.zeros((0, N_CH, N_T), np.float32))
