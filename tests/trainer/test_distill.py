"""Ensemble distillation in local training (``--distill-from``, :mod:`neurofed.trainer.fl.distill`): the soft targets,
their loss (Hinton's at temperature 1), both engines, and the refusals that keep a teacher from leaking a fold's
held-out subjects."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.experiments.simulate import SimConfig, distilled
from neurofed.trainer.experiments.spec import SpecError, parse_options
from neurofed.trainer.fl.distill import soft_targets, teacher_probabilities
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

pytestmark = pytest.mark.unit


def test_soft_targets_mix_labels_and_teachers():
    y = np.array([0, 1, 1])
    p = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    q = soft_targets(y, p, 0.5)
    assert q.dtype == np.float32 and np.allclose(q.sum(1), 1)
    assert np.allclose(q, [[0.9, 0.1], [0.15, 0.85], [0.3, 0.7]])
    assert np.allclose(soft_targets(y, p, 0.0), np.eye(2)[y]) and np.allclose(soft_targets(y, p, 1.0), p)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="weight"):
            soft_targets(y, p, bad)
    with pytest.raises(ValueError, match="do not fit"):
        soft_targets(y, p[:2], 0.5)


def test_loss_is_hinton_at_temperature_one():
    """CE(q) = (1 - w) CE(y) + w KL(teacher || student) + w H(teacher)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 2, generator=g)
    y = np.array([0, 1, 0, 1, 1, 0])
    p = torch.softmax(torch.randn(6, 2, generator=g), 1).numpy()
    w = 0.3
    q = torch.as_tensor(soft_targets(y, p, w))
    pt = torch.as_tensor(p, dtype=torch.float32)
    kl = F.kl_div(torch.log_softmax(z, 1), pt, reduction="batchmean")
    ent = -(pt * pt.log()).sum(1).mean()
    want = (1 - w) * F.cross_entropy(z, torch.as_tensor(y)) + w * (kl + ent)
    assert torch.allclose(F.cross_entropy(z, q), want, atol=1e-6)


def _fed(subjects, engine: str, name: str = "safe"):
    clients = {sd.subject: sd for sd in subjects}
    m, _ = run_federated(clients, "eegnet", get_strategy(name), LocalConfig(local_epochs=1, augment="shift:0.05"), 2,
                         0.5, 3, engine=engine)
    return m.state_dict()


def test_engines_agree_on_soft_targets_and_one_hot_is_plain_training(subjects4, name="safe"):
    """SAFE: the soft targets in FGSM's attack loss and in the training loss, in both engines."""
    rng = np.random.default_rng(0)
    soft = [replace(sd, y=soft_targets(sd.y, rng.dirichlet([1, 1], len(sd.y)), 0.5)) for sd in subjects4]
    seq, vec = _fed(soft, "sequential", name), _fed(soft, "vectorised", name)
    tol = 2e-4 if name == "safe" else 2e-6  # FGSM's sign flips (tests/trainer/test_vectorised.py)
    assert max(float((seq[k].double() - vec[k].double()).abs().max()) for k in seq) <= tol
    hard = _fed(subjects4, "sequential", name)
    onehot = _fed([replace(sd, y=soft_targets(sd.y, np.full((len(sd.y), 2), 0.5), 0.0)) for sd in subjects4],
                  "sequential", name)
    assert max(float((hard[k].double() - onehot[k].double()).abs().max()) for k in hard) <= 1e-5
    assert any(not torch.allclose(seq[k].double(), hard[k].double()) for k in seq if seq[k].is_floating_point())


def _teacher(run, sd, pre: dict, held: list[str], seed: int = 0):
    """A saved 'job' of fold 0 whose model decodes ``sd``'s shape; returns the model."""
    from neurofed.trainer.checkpoint import ModelMeta, save_checkpoint
    from neurofed.trainer.fl.init import init_model

    model = init_model("eegnet", sd, "batch_specific", seed)
    (run / "jobs").mkdir(parents=True, exist_ok=True)
    meta = ModelMeta("eegnet", sd.X.shape[1], 2, sd.X.shape[2], sd.sfreq, "batch_specific", list(sd.ch_names),
                     list(sd.classes), pre, "safe", 8, {}, {})
    ckpt = run / "jobs" / f"seed{seed}_fold00.safetensors"
    save_checkpoint(ckpt, model.state_dict(), meta)
    job = {"fold": 0, "seed": seed, "test_subjects": held, "per_subject": {}, "checkpoint": str(ckpt)}
    (run / "jobs" / f"seed{seed}_fold00.json").write_text(json.dumps(job))
    return model


def test_teachers_of_the_fold_only(subjects4, small_cfg, data_dir, tmp_path):
    """The teachers' mean probabilities, each teacher reading the trials through its own preprocessing (a 64-channel
    teacher of a 21-channel student); a teacher run whose fold held out other subjects is refused (it trained on this
    fold's test subjects)."""
    from neurofed.trainer.data import PreprocessConfig, load_subjects

    train, test = subjects4[:3], subjects4[3:]
    held = [s.subject for s in test]
    sd = train[0]
    t21 = _teacher(tmp_path / "t21", sd, small_cfg.to_dict(), held)
    wide = PreprocessConfig.from_preset("all", resample=80.0)
    sd64 = load_subjects([1], wide, data_dir)[0]
    t64 = _teacher(tmp_path / "t64", sd64, wide.to_dict(), held, seed=1)
    cfg = SimConfig(distill_from=[str(tmp_path / "t21"), str(tmp_path / "t64")], distill_weight=0.5,
                    preprocess=small_cfg.to_dict(), data_dir=str(data_dir))
    used: list[str] = []
    out = distilled(cfg, 0, train, test, used)
    probs = (teacher_probabilities([t21], sd.X, 8) + teacher_probabilities([t64], sd64.X, 8)) / 2
    assert sd64.X.shape[1] == 64 and np.array_equal(sd64.y, sd.y)
    assert np.allclose(out[0].y, soft_targets(sd.y, probs, 0.5), atol=1e-6) and len(used) == 2
    with pytest.raises(NeuroFedError, match="never have trained on this fold's held-out"):
        distilled(cfg, 0, subjects4[1:], subjects4[:1], [])
    with pytest.raises(NeuroFedError, match="no saved model of this fold"):
        distilled(cfg, 1, train, test, [])
    with pytest.raises(NeuroFedError, match="whole-subject clients"):
        distilled(replace(cfg, partition="dirichlet:0.5"), 0, train, test, [])


def test_options_refuse_what_cannot_distil():
    cfg = parse_options({"subjects": "1-4", "distill_from": "runs/a,runs/b", "distill_weight": 0.7}).to_sim_config()
    assert cfg.distill_from == ["runs/a", "runs/b"] and cfg.distill_weight == 0.7
    off = parse_options({"subjects": "1-4"}).to_sim_config()
    assert off.distill_from == [] and off.distill_weight == 0.5
    for bad, flag in (({"distill_weight": 0.0}, "--distill-weight"), ({"algorithm": "fed-csp-lda"}, "--distill-from"),
                      ({"algorithm": "moon"}, "--distill-from"), ({"byzantine": "0.2:scale:10"}, "--distill-from")):
        with pytest.raises(SpecError, match=flag):
            parse_options({"subjects": "1-4", "distill_from": "runs/a", **bad}).to_sim_config()
