"""Attacks through the Adversarial Robustness Toolbox (ART), on NeuroFed's per-channel-std budget.

ART assumes a scalar epsilon, an input box and image-shaped inputs. The wrapper :class:`ScaledBatch` shows ART each trial
divided by its own per-channel standard deviation over time (``z = x / std_t(x)``), shaped (n, 1, H, W) like a near-square one-colour image (ART's Square
attack draws square patches and needs H and W of similar size; the layout only shapes its random
proposals, the budget is the same), so a scalar ``eps`` in ``z`` is ``eps x std`` per channel in ``x``, exactly NeuroFed's budget (:func:`neurofed.trainer.attacks.channel_budget`),
and the input box is ``[-BOX, BOX]`` standard deviations, far outside any trial (never clips; ART's
Square attack needs a box).

Batch-specific BN makes a trial's output depend on its test batch, so attacks run on whole test batches
(8 trials, the deployment setting). ART sometimes queries a subset of the batch (AutoAttack and Square
drop trials already fooled; HopSkipJump queries one trial many times); the wrapper then recognises each
queried row as the batch trial it is nearest to (the perturbations are far smaller than the distance
between trials), puts it in its place in the batch — the other trials keep their clean values — and
returns that row's logits. Queries of the whole batch are therefore exactly the model on the batch.

Score-based attacks ask the same batch again and again (ART's Square asks for the whole batch, then the
still-robust trials, then the proposal, every iteration; when no proposal was accepted or no trial has fallen
yet, the first two are the batch it just scored). Without gradients the wrapper therefore keeps the logits of
its last few batches by their exact bytes and answers a repeated batch from them: the same numbers, fewer
forward passes (``ScaledBatch.forwards`` against ``ScaledBatch.queries``).

Budgets (``LIBRARY_BUDGETS``) are stated in each run's results (``attack_budgets``).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

logger = logging.getLogger("neurofed.trainer")

#: Input box of the scaled inputs, in per-channel standard deviations (EEG trials sit within about +-10).
BOX = 1e4

#: Query/iteration budgets of the library attacks (per test batch of 8 trials unless said otherwise).
LIBRARY_BUDGETS: dict[str, dict] = {
    "autoattack": {"suite": "APGD-CE (100 iterations, 1 restart); APGD-DLR if > 2 classes; Square",
                   "apgd_iter": 100, "square_queries": 1000},
    "square": {"queries": 1000, "restarts": 1, "p_init": 0.8},
    "hsj": {"max_iter": 5, "max_eval": 100, "init_eval": 20, "max_queries": 3000,
            "note": "HopSkipJump (L-inf), hard-label; queries per trial <= max_iter x (max_eval + binary search); "
                    "a trial whose attack asks more than max_queries queries is stopped there and counts as a failed "
                    "attack (ART's step-size search can loop when the boundary it found does not hold; the count "
                    "of such trials is in HSJ_STATS and the run's results); "
                    "only trials the model labels correctly are attacked, each started from another trial of the "
                    "batch with a different prediction; "
                    "a result outside the eps ball counts as a failed attack (the clean trial is kept)"},
}


class QueryBudgetExceeded(RuntimeError):
    """A library attack asked the model more often than its query budget allows (see ``ScaledBatch.max_queries``)."""


#: Trials HopSkipJump attacked and trials it stopped at ``max_queries`` since the last :func:`reset_hsj_stats`
#: (the experiment scripts record them beside the numbers).
HSJ_STATS: dict[str, int] = {"attacked": 0, "capped": 0}


def reset_hsj_stats() -> None:
    HSJ_STATS.update(attacked=0, capped=0)


class ScaledBatch(nn.Module):
    """``model`` seen on std-scaled inputs of one fixed test batch (see the module docstring).

    Parameters
    ----------
    model : nn.Module
        The classifier (eval mode).
    x : Tensor, shape (n, c, t)
        The clean test batch.
    """

    def __init__(self, model: nn.Module | Callable[[Tensor], Tensor], x: Tensor) -> None:
        super().__init__()
        self.model = model
        self.x = x.detach()
        self.scale = x.detach().std(dim=-1, keepdim=True)
        self.z = self.x / self.scale
        #: rows queried so far, and the most allowed (None: no limit); past it a query raises QueryBudgetExceeded
        self.queries = 0
        self.max_queries: int | None = None
        #: forward passes of the model actually run (a batch asked again is answered from the cache)
        self.forwards = 0
        self._cache: OrderedDict[bytes, Tensor] = OrderedDict()

    #: batches whose logits are kept (by their exact bytes) for repeated gradient-free queries
    CACHE_SIZE = 4

    def _batch_logits(self, xb: Tensor) -> Tensor:
        """``model(xb)``; without gradients a batch seen among the last ``CACHE_SIZE`` is answered from the cache."""
        if torch.is_grad_enabled() and xb.requires_grad:
            self.forwards += 1
            return self.model(xb)
        key = hashlib.blake2b(xb.detach().contiguous().numpy().tobytes(), digest_size=16).digest()
        hit = self._cache.get(key)
        if hit is None:
            self.forwards += 1
            with torch.no_grad():
                hit = self.model(xb).detach()
            self._cache[key] = hit
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return hit

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(1, H, W): H the largest divisor of c*t not above sqrt(c*t) (21 x 320 -> 80 x 84)."""
        n = int(self.x.shape[1] * self.x.shape[2])
        h = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        return 1, h, n // h

    def to_z(self, x: Tensor) -> np.ndarray:
        """Scaled trials as ART sees them: shape (n, 1, H, W), a near-square one-colour image."""
        return (x / self.scale).reshape(len(x), *self.image_shape).numpy()

    def to_x(self, z: np.ndarray) -> Tensor:
        return torch.as_tensor(z, dtype=self.x.dtype).reshape(-1, *self.x.shape[1:]) * self.scale

    def rows(self, z: Tensor) -> Tensor:
        """Index of the batch trial each queried row is nearest to (L-inf in scaled units)."""
        d = (z.detach().unsqueeze(1) - self.z.unsqueeze(0)).abs().flatten(2).amax(-1)
        return d.argmin(1)

    def forward(self, z: Tensor) -> Tensor:
        z = z.reshape(-1, *self.x.shape[1:]).to(self.x.dtype)
        self.queries += len(z)
        if self.max_queries is not None and self.queries > self.max_queries:
            raise QueryBudgetExceeded(f"{self.queries} queries > budget {self.max_queries}")
        idx = self.rows(z)
        out: list[Tensor | None] = [None] * len(z)
        pending = list(range(len(z)))
        while pending:  # groups of rows naming distinct trials: one batch each
            used, group, rest = set(), [], []
            for i in pending:
                (rest if int(idx[i]) in used else group).append(i)
                used.add(int(idx[i]))
            g = torch.tensor(group)
            xb = self.x.index_put((idx[g],), z[g] * self.scale[idx[g]])
            logits = self._batch_logits(xb)[idx[g]]
            for k, i in enumerate(group):
                out[i] = logits[k]
            pending = rest
        return torch.stack(out)  # type: ignore[arg-type]


def _classifier(wrapper: ScaledBatch, n_classes: int):
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(model=wrapper, loss=nn.CrossEntropyLoss(), input_shape=wrapper.image_shape,
                             nb_classes=n_classes, clip_values=(-BOX, BOX), channels_first=True, device_type="cpu")


def _setup(model: nn.Module, x: Tensor, seed: int):
    np.random.seed(seed % 2**32)  # ART draws from numpy's global generator
    torch.manual_seed(seed)
    model.eval()
    wrapper = ScaledBatch(model, x)
    with torch.no_grad():
        n_classes = int(model(x).shape[1])
    return wrapper, _classifier(wrapper, n_classes), n_classes


def _p_init(wrapper: ScaledBatch, p: float) -> float:
    """Square's initial patch fraction, capped so its first patch fits the image (ART fails otherwise)."""
    _, h, w = wrapper.image_shape
    return min(p, (h - 1.5) ** 2 / (h * w))


def art_fgsm(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
    """ART's FastGradientMethod (L-inf) through the wrapper: equals :func:`neurofed.trainer.attacks.fgsm`."""
    from art.attacks.evasion import FastGradientMethod

    wrapper, clf, _ = _setup(model, x, seed)
    atk = FastGradientMethod(clf, norm=np.inf, eps=eps, batch_size=len(x))
    return wrapper.to_x(atk.generate(wrapper.to_z(x), y=y.numpy()))


def art_pgd(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0, steps: int = 10,
            random_start: bool = True) -> Tensor:
    """ART's ProjectedGradientDescent (L-inf, step eps/4, ``steps`` steps) through the wrapper."""
    from art.attacks.evasion import ProjectedGradientDescent

    wrapper, clf, _ = _setup(model, x, seed)
    atk = ProjectedGradientDescent(clf, norm=np.inf, eps=eps, eps_step=eps / 4, max_iter=steps,
                                   num_random_init=int(random_start), batch_size=len(x), verbose=False)
    return wrapper.to_x(atk.generate(wrapper.to_z(x), y=y.numpy()))


def autoattack(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
    """ART's AutoAttack with the suite of ``LIBRARY_BUDGETS['autoattack']`` (untargeted, L-inf).

    The standard suite's APGD-T/DLR needs at least three classes and FAB-T is not in ART: with two classes
    the suite is APGD-CE then Square, each on the trials the previous attacks left correct.
    """
    from art.attacks.evasion import AutoAttack, AutoProjectedGradientDescent, SquareAttack

    b = LIBRARY_BUDGETS["autoattack"]
    wrapper, clf, n_classes = _setup(model, x, seed)
    losses = ["cross_entropy"] + (["difference_logits_ratio"] if n_classes > 2 else [])
    suite = [AutoProjectedGradientDescent(clf, norm=np.inf, eps=eps, eps_step=eps / 4, max_iter=b["apgd_iter"],
                                          nb_random_init=1, batch_size=len(x), loss_type=loss, verbose=False)
             for loss in losses]
    suite.append(SquareAttack(clf, norm=np.inf, eps=eps, max_iter=b["square_queries"], p_init=_p_init(wrapper, 0.8),
                              nb_restarts=1,
                              batch_size=len(x), verbose=False))
    atk = AutoAttack(clf, norm=np.inf, eps=eps, eps_step=eps / 4, attacks=suite, batch_size=len(x))
    return wrapper.to_x(atk.generate(wrapper.to_z(x), y=y.numpy()))


def square(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
    """ART's Square attack (score-based black box, L-inf), budget ``LIBRARY_BUDGETS['square']``."""
    return _square(*_setup(model, x, seed)[:2], x, y, eps)


def _square(wrapper: ScaledBatch, clf, x: Tensor, y: Tensor, eps: float) -> Tensor:
    from art.attacks.evasion import SquareAttack

    b = LIBRARY_BUDGETS["square"]
    atk = SquareAttack(clf, norm=np.inf, eps=eps, max_iter=b["queries"], p_init=_p_init(wrapper, b["p_init"]),
                       nb_restarts=b["restarts"], batch_size=len(x), verbose=False)
    return wrapper.to_x(atk.generate(wrapper.to_z(x), y=y.numpy()))


def hsj(model: nn.Module, x: Tensor, y: Tensor, eps: float, seed: int = 0) -> Tensor:
    """ART's HopSkipJump (hard-label black box, L-inf), accepted only within the eps ball.

    No maintained RayS implementation exists in ART or torchattacks, so the hard-label attack is HopSkipJump.
    Only trials the model labels correctly are attacked (a wrong one is already adversarial and is returned
    as it is). Each starts from another trial of its batch that the model labels differently (clean noise
    otherwise); a result farther than ``eps`` (in std units) from the trial is discarded, and so is an attack
    stopped at ``LIBRARY_BUDGETS['hsj']['max_queries']`` queries (counted in :data:`HSJ_STATS`).
    """
    return _hsj(*_setup(model, x, seed)[:2], x, y, eps, seed)


def _hsj(wrapper: ScaledBatch, clf, x: Tensor, y: Tensor, eps: float, seed: int) -> Tensor:
    from art.attacks.evasion import HopSkipJump

    b = LIBRARY_BUDGETS["hsj"]
    z = wrapper.to_z(x)
    pred = clf.predict(z, batch_size=len(x)).argmax(1)
    # HopSkipJump's untargeted goal is "a label other than the model's own": on a trial the model gets wrong
    # that would be the right label, so only the correctly labelled trials are attacked.
    todo = np.flatnonzero(pred == np.asarray(y))
    z_adv = z.copy()
    if len(todo) == 0:
        return wrapper.to_x(z_adv)
    rng = np.random.default_rng(seed)
    zt = z[todo]
    init = np.empty_like(zt)
    for k, i in enumerate(todo):
        other = np.flatnonzero(pred != pred[i])
        init[k] = z[rng.choice(other)] if len(other) else z[i] + rng.normal(size=z[i].shape).astype(z.dtype)
    atk = HopSkipJump(clf, batch_size=len(x), targeted=False, norm=np.inf, max_iter=b["max_iter"],
                      max_eval=b["max_eval"], init_eval=b["init_eval"], verbose=False)
    found = zt.copy()  # a stopped attack leaves its trial clean
    for k, i in enumerate(todo):  # one trial at a time, each with its own query budget
        wrapper.queries, wrapper.max_queries = 0, b.get("max_queries")
        HSJ_STATS["attacked"] += 1
        try:
            found[k] = atk.generate(zt[k : k + 1], x_adv_init=init[k : k + 1])[0]
        except QueryBudgetExceeded:
            HSJ_STATS["capped"] += 1
            logger.warning("HopSkipJump stopped on trial %d of its batch at %d queries: counted as not fooled",
                           int(i), wrapper.max_queries)
        finally:
            wrapper.max_queries = None
    near = np.abs(found - zt).reshape(len(todo), -1).max(1) <= eps * (1 + 1e-6)
    z_adv[todo[near]] = found[near]
    return wrapper.to_x(z_adv)


def blackbox_on_scores(attack: str, score_fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray,
                       eps: float, seed: int = 0) -> np.ndarray:
    """A black-box library attack (``square`` or ``hsj``) on any class-score function of trials.

    For models outside torch (the classical references): ``score_fn`` maps trials (m, c, t) to class
    scores (m, k); the same std scaling, input box and budgets as for the torch models apply.
    """
    if attack not in ("square", "hsj"):
        raise ValueError(f"black-box attack {attack!r}: use square or hsj")
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    np.random.seed(seed % 2**32)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    wrapper = ScaledBatch(lambda xb: torch.as_tensor(score_fn(xb.detach().numpy())), xt)
    n_classes = int(np.asarray(score_fn(xt.numpy()[:1])).shape[1])
    clf = BlackBoxClassifierNeuralNetwork(lambda z: wrapper(torch.as_tensor(z)).numpy(), wrapper.image_shape,
                                          n_classes, clip_values=(-BOX, BOX))
    yt = torch.as_tensor(np.asarray(y))
    out = _square(wrapper, clf, xt, yt, eps) if attack == "square" else _hsj(wrapper, clf, xt, yt, eps, seed)
    return out.numpy()


#: Library attacks (name -> function(model, x, y, eps, seed) -> adversarial batch).
LIBRARY_ATTACKS = {"art_fgsm": art_fgsm, "art_pgd": art_pgd, "autoattack": autoattack, "square": square, "hsj": hsj}
