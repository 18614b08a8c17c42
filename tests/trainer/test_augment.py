"""Augmentation in local training (``--augment``, :mod:`neurofed.trainer.fl.augment`): seeded, shape- and
label-preserving (the mirror: the other hand's label), the same in both engines, and off by default (every earlier configuration unchanged)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.experiments.simulate import local_config
from neurofed.trainer.experiments.spec import SpecError, parse_options
from neurofed.trainer.fl.augment import RECIPES, Augment, mirror_channels, mirror_classes, mixed_ce
from neurofed.trainer.fl.local import LocalConfig, batches
from neurofed.trainer.fl.strategies import get_strategy


def _batch(seed: int = 0, b: int = 8, c: int = 21, t: int = 320):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((b, c, t), generator=g), torch.tensor([0, 1] * (b // 2))


def test_parse_recipe_and_errors():
    assert Augment.parse("mi") == Augment.parse(RECIPES["mi"]) == Augment(shift=0.05, scale=0.1, dropout=0.1, mixup=0.2)
    assert not Augment.parse("").on and not Augment.parse(None).on
    for bad in ("warp:0.1", "shift", "shift:x", "shift:0.6", "dropout:-0.1", "scale:1.0", "mirror:1.5"):
        with pytest.raises(ValueError, match="augment"):
            Augment.parse(bad)


def test_options_validate_and_off_by_default():
    assert "augment" not in LocalConfig().to_dict()  # off: config.json and every job as before
    assert LocalConfig(augment="mi").to_dict()["augment"] == "mi"
    cfg = parse_options({"algorithm": "fedbs", "subjects": "1-4", "augment": "mi"}).to_sim_config()
    assert cfg.local["augment"] == "mi"
    assert "augment" not in parse_options({"subjects": "1-4"}).to_sim_config().local
    with pytest.raises(SpecError, match="--augment"):
        parse_options({"subjects": "1-4", "augment": "warp:1"}).to_sim_config()
    with pytest.raises(SpecError, match="nothing to augment"):
        parse_options({"algorithm": "fed-csp-lda", "subjects": "1-4", "augment": "mi"}).to_sim_config()


@pytest.mark.parametrize("spec", ["mi", "shift:0.1", "scale:0.2", "noise:0.1", "dropout:0.2", "mixup:0.4"])
def test_deterministic_shapes_labels(spec):
    aug = Augment.parse(spec)
    x, y = _batch()
    x0 = x.clone()
    a1 = aug(x, y, aug.rng(3))
    a2 = aug(x, y, aug.rng(3))
    a3 = aug(x, y, aug.rng(4))
    assert torch.equal(x, x0)  # not in place
    assert torch.equal(a1[0], a2[0]) and a1[3] == a2[3]
    assert not torch.equal(a1[0], a3[0])
    xa, ya, y2, lam = a1
    assert xa.shape == x.shape and xa.dtype == x.dtype
    assert torch.equal(ya, y)  # a trial keeps its label (mixup: as the dominant one)
    if aug.mixup:
        assert y2 is not None and 0.5 <= lam <= 1 and sorted(y2.tolist()) == sorted(y.tolist())
    else:
        assert y2 is None and lam == 1.0


def test_transforms_do_what_they_say():
    x, y = _batch(b=64)
    xs, *_ = Augment(shift=0.1)(x, y, np.random.default_rng(0))
    for i in range(64):  # a zero-filled shift of each trial by at most 32 samples
        s = next(s for s in range(-32, 33) if (torch.equal(xs[i, :, s:], x[i, :, : 320 - s]) if s >= 0 else
                                              torch.equal(xs[i, :, : 320 + s], x[i, :, -s:])))
        assert (xs[i, :, :s] == 0).all() if s > 0 else (xs[i, :, 320 + s:] == 0).all()
    xd, *_ = Augment(dropout=0.3)(x, y, np.random.default_rng(0))
    dropped = (xd == 0).all(-1)
    assert 0.15 < float(dropped.float().mean()) < 0.45
    assert torch.equal(xd[~dropped], x[~dropped])
    xc, *_ = Augment(scale=0.1)(x, y, np.random.default_rng(0))
    f = (xc / x).reshape(64, -1)
    assert torch.allclose(f, f[:, :1].expand_as(f), rtol=1e-4) and ((f[:, 0] - 1).abs() <= 0.1 + 1e-5).all()


def test_mixup_loss_is_soft_label_ce():
    x, y = _batch()
    logits = torch.randn(8, 2)
    _, ya, y2, lam = Augment(mixup=1.0)(x, y, np.random.default_rng(1))
    soft = lam * torch.nn.functional.one_hot(ya, 2).float() + (1 - lam) * torch.nn.functional.one_hot(y2, 2).float()
    assert torch.allclose(mixed_ce(logits, ya, y2, lam), torch.nn.functional.cross_entropy(logits, soft))
    assert torch.equal(mixed_ce(logits, y, None, 1.0), torch.nn.functional.cross_entropy(logits, y))


def test_own_stream_leaves_batches_alone():
    """The mini-batches come from default_rng(seed), the augmentation from its own stream of the same seed."""
    rng = np.random.default_rng(7)
    b1 = batches(45, 8, rng)
    _ = Augment.parse("mi").rng(7).random(100)
    b2 = batches(45, 8, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(b1, b2))


def _fed(subjects, engine: str, augment: str, name: str = "fedbs"):
    clients = {sd.subject: sd for sd in subjects}
    m, _ = run_federated(clients, "eegnet", get_strategy(name), LocalConfig(local_epochs=1, augment=augment), 2, 0.5, 3,
                         engine=engine)
    return m.state_dict()


@pytest.mark.parametrize("name", ["fedbs", "safe"])
def test_engines_agree_and_augment_changes_training(subjects4, name):
    seq = _fed(subjects4, "sequential", "mi", name)
    vec = _fed(subjects4, "vectorised", "mi", name)
    tol = 2e-4 if name == "safe" else 2e-6  # FGSM's sign flips (tests/trainer/test_vectorised.py)
    assert max(float((seq[k].double() - vec[k].double()).abs().max()) for k in seq) <= tol
    off = _fed(subjects4, "sequential", "", name)
    assert any(not torch.allclose(seq[k].double(), off[k].double()) for k in seq if seq[k].is_floating_point())
    again = _fed(subjects4, "sequential", "mi", name)
    assert all(torch.equal(seq[k], again[k]) for k in seq)


def test_mirror_maps_hemispheres_and_classes():
    perm = mirror_channels(SENSORIMOTOR_21)
    names = list(SENSORIMOTOR_21)
    pairs = {names[i]: names[j] for i, j in enumerate(perm)}
    assert pairs["C3"] == "C4" and pairs["C4"] == "C3" and pairs["FC5"] == "FC6" and pairs["CP1"] == "CP2"
    assert all(pairs[n] == n for n in ("FCz", "Cz", "CPz"))
    assert [perm[j] for j in perm] == list(range(len(perm)))  # an involution
    assert mirror_channels(["C3..", "Cz..", "C4.."]) == (2, 1, 0)  # EDF's trailing dots
    with pytest.raises(ValueError, match="no mirror partner"):
        mirror_channels(["C3", "Cz"])
    with pytest.raises(ValueError, match="not a 10-10 position"):
        mirror_channels(["C3", "C4", "EXG1x"])
    assert mirror_classes(("left_fist", "right_fist")) == (1, 0)
    assert mirror_classes(("both_fists", "feet")) == (0, 1)  # no side: each class its own mirror
    with pytest.raises(ValueError, match="no mirror class"):
        mirror_classes(("left_fist", "feet"))


def test_mirror_swaps_channels_and_labels():
    x, y = _batch(b=64)
    aug = Augment.parse("mirror:0.5")
    with pytest.raises(ValueError, match="bind"):
        aug(x, y, aug.rng(0))
    aug = aug.bind(SENSORIMOTOR_21, ("left_fist", "right_fist"))
    perm = list(mirror_channels(SENSORIMOTOR_21))
    x0 = x.clone()
    xm, ym, y2, lam = aug(x, y, aug.rng(0))
    assert torch.equal(x, x0) and y2 is None and lam == 1.0
    flipped = ym != y
    assert 16 < int(flipped.sum()) < 48  # about half of 64
    assert torch.equal(xm[flipped], x[flipped][:, perm]) and torch.equal(xm[~flipped], x[~flipped])
    assert torch.equal(ym[flipped], 1 - y[flipped])
    soft = torch.tensor([[0.9, 0.1]] * 64)  # distillation's soft targets: the columns trade places
    _, ys, *_ = aug(x, soft, aug.rng(0))
    assert torch.equal(ys[flipped], soft[flipped].flip(-1)) and torch.equal(ys[~flipped], soft[~flipped])
    assert Augment.parse("mirror:0.5").bind(SENSORIMOTOR_21, ("a", "b")) == Augment(mirror=0.5)  # same spec


def test_mirror_needs_names_and_one_montage(subjects4):
    cfg = LocalConfig(augment="mirror:0.5")  # the names come later, from the data
    with pytest.raises(ValueError, match="channel and class names"):
        cfg.augmentation()
    plain = LocalConfig(augment="mi")
    assert plain.bound(SENSORIMOTOR_21, ("left_fist", "right_fist")) is plain  # only a mirror takes the names
    with pytest.raises(ValueError, match="no mirror partner"):  # an edge client's own montage, checked as it binds
        cfg.bound(["C3", "Cz"], ("left_fist", "right_fist"))
    bound = local_config({"augment": "mirror:0.5"}, subjects4)
    assert bound.channels == tuple(subjects4[0].ch_names) and bound.classes == tuple(subjects4[0].classes)
    assert bound.to_dict()["channels"] == list(bound.channels)
    assert "channels" not in local_config({"augment": "mi"}, subjects4).to_dict()  # only a mirror needs them
    other = subjects4[1].__class__(**{**subjects4[1].__dict__, "ch_names": list(subjects4[1].ch_names)[::-1]})
    with pytest.raises(NeuroFedError, match="one montage"):
        local_config({"augment": "mirror:0.5"}, [subjects4[0], other])


def test_mirror_engines_agree(subjects4):
    clients = {sd.subject: sd for sd in subjects4}
    cfg = local_config({"augment": "mirror:0.5,shift:0.05", "local_epochs": 1}, subjects4)
    states = [run_federated(clients, "eegnet", get_strategy("fedbs"), cfg, 2, 0.5, 3, engine=e)[0].state_dict()
              for e in ("sequential", "vectorised")]
    assert max(float((states[0][k].double() - states[1][k].double()).abs().max()) for k in states[0]) <= 2e-6
