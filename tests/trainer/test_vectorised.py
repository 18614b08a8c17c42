"""The vectorised engine (all of a round's clients in one batched computation) equals the sequential one.

Real EEG (subjects 1-4, 21 channels at 80 Hz), 2 rounds, every registered algorithm: the final global model and the
server extras of ``run_federated(engine="vectorised")`` equal ``engine="sequential"`` to :data:`TOL` (FGSM's
algorithms to :data:`TOL_FGSM`: its ``sign`` of input gradients that are ~0 can flip between two orders of
summation); algorithms the engine does not know run on the sequential path and are bit-identical.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl import vectorised
from neurofed.trainer.fl.algorithms.classical import CLASSICAL_MODELS
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import CLIPPED_KEY
from neurofed.trainer.fl.strategies import ALGORITHMS, get_strategy
from neurofed.trainer.fl.vectorised import _warned, unsupported
from neurofed.trainer.models import build_model

#: largest |difference| allowed between the engines' final states (float32 arithmetic in another order)
TOL = 2e-6
#: with FGSM (SAFE, FAL's PGD does not vectorise): a flipped sign of a ~0 input gradient moves a few inputs
TOL_FGSM = 2e-4
CFG = LocalConfig(local_epochs=1)
#: what the engine leaves to the sequential path, and why (asserted: these are bit-identical)
FALLBACK = {"ct": "centralised", "fal": "not known", "ct_at": "centralised", "fedbm": "reshapes the client model",
            "fleeg": "per-group", "fedfa": "not known", "ga": "not known",
            "fed-csp-lda": "fitted from summed statistics", "fed-tangent": "fitted from summed statistics"}


def _run(subjects, name: str, engine: str, **over):
    st = get_strategy(name, **over)
    model = CLASSICAL_MODELS.get(name, "fleeg_eegnet" if st.group_prefixes else "eegnet")
    groups = {sd.subject: "lab" for sd in subjects} if st.group_prefixes else None
    clients = {sd.subject: sd for sd in subjects}
    fraction = 1.0 if st.needs_every_client else 0.5
    m, info = run_federated(clients, model, st, CFG, 2, fraction, 3, engine=engine, groups=groups)
    extras = {k: v for k, v in info["server"].extras.items() if k != CLIPPED_KEY}
    return {**{f"g.{k}": v for k, v in m.state_dict().items()}, **{f"x.{k}": v for k, v in extras.items()}}, info


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_vectorised_equals_sequential(subjects4, name):
    st = get_strategy(name)
    if st.centralised:  # CT trains one pooled client: no round of clients to vectorise
        assert FALLBACK[name] in unsupported(build_model("eegnet", 21, 2, 320, 80.0), st)
        return
    try:
        seq, info_s = _run(subjects4, name, "sequential")
    except ImportError as exc:  # FedBM's sentence encoder is an optional extra
        pytest.skip(f"{name} needs an optional extra: {exc}")
    vec, info_v = _run(subjects4, name, "vectorised")
    if name in FALLBACK:
        assert all(torch.equal(seq[k], vec[k]) for k in seq), f"{name} falls back: must be bit-identical"
        return
    tol = TOL_FGSM if st.settings.get("fat_eps", 0) > 0 else TOL
    assert _max_diff(seq, vec) <= tol
    ls, lv = ([p["loss"] for p in i["curve"]] for i in (info_s, info_v))
    np.testing.assert_allclose(ls, lv, rtol=1e-5)


@pytest.mark.parametrize("name", ["fedavg", "fedbs", "safe", "scaffold", "moon"])
def test_ragged_clients_equal(subjects4, name, monkeypatch):
    """Clients with different numbers of trials: different step counts and last-batch sizes (45, 37, 26, 19); at most
    two clients per vmapped call (so a step runs as several calls)."""
    monkeypatch.setattr(vectorised, "CHUNK", 2)
    ragged = [replace(sd, X=sd.X[:n], y=sd.y[:n]) for sd, n in zip(subjects4, (45, 37, 26, 19))]
    st = get_strategy(name)
    clients = {sd.subject: sd for sd in ragged}
    out = {}
    for engine in ("sequential", "vectorised"):
        m, info = run_federated(clients, "eegnet", st, CFG, 2, 1.0, 5, engine=engine)
        out[engine] = {**m.state_dict(), **info["server"].extras}
    tol = TOL_FGSM if st.settings.get("fat_eps", 0) > 0 else TOL
    assert _max_diff(out["sequential"], out["vectorised"]) <= tol


def test_dropout_noise_from_a_client_generator_is_the_global_streams():
    """The sequential path seeds the global generator with the client's seed; a Generator with that seed draws the
    same dropout masks (F.dropout on CPU: bernoulli_(1 - p) on the input's shape)."""
    x = torch.randn(5, 16, 1, 80)
    torch.manual_seed(123)
    a, b = F.dropout(x, 0.5, True), F.dropout(x[:3], 0.5, True)
    g = torch.Generator().manual_seed(123)
    na = torch.empty_like(x).bernoulli_(0.5, generator=g).div_(0.5)
    nb = torch.empty(3, 16, 1, 80).bernoulli_(0.5, generator=g).div_(0.5)
    assert torch.equal(a, x * na) and torch.equal(b, x[:3] * nb)


@pytest.mark.parametrize("model", ["shallow", "deep", "itnet", "eegnet_crop"])
def test_other_models_equal(subjects4, data_dir, model):
    if model == "deep":  # DeepConvNet needs >= 441 samples: 21 channels at 160 Hz
        from neurofed.trainer.data import PreprocessConfig, load_subjects

        subjects4 = load_subjects([1, 2], PreprocessConfig.from_preset("sensorimotor21"), data_dir)
    clients = {sd.subject: sd for sd in subjects4[:3]}
    st = get_strategy("fedbs")
    if model != "deep":  # really on the vectorised engine, not its sequential fallback
        assert unsupported(build_model(model, 21, 2, subjects4[0].X.shape[2], 80.0), st) is None
    out = {}
    for engine in ("sequential", "vectorised"):
        m, _ = run_federated(clients, model, st, CFG, 1, 1.0, 0, engine=engine)
        out[engine] = m.state_dict()
    if model == "deep":  # not vectorised (see neurofed.trainer.fl.vectorised._MODELS): the sequential path, bit-identical
        assert all(torch.equal(out["sequential"][k], out["vectorised"][k]) for k in out["sequential"])
        return
    assert _max_diff(out["sequential"], out["vectorised"]) <= TOL


def test_unknown_hook_falls_back_and_says_so_once(subjects4, caplog):
    clients = {sd.subject: sd for sd in subjects4[:2]}
    _warned.clear()
    with caplog.at_level(logging.WARNING, logger="neurofed.trainer"):
        for _ in range(2):
            run_federated(clients, "eegnet", get_strategy("fedfa"), CFG, 2, 1.0, 0, engine="vectorised")
    lines = [r.message for r in caplog.records if "vectorised engine" in r.message]
    assert len(lines) == 1 and "_FedFAHook" in lines[0] and "sequential engine" in lines[0]
    with pytest.raises(ValueError, match="engine must be one of"):
        run_federated(clients, "eegnet", get_strategy("fedavg"), CFG, 1, 1.0, 0, engine="gpu")

