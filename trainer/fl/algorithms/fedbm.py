"""FedBM (Zhu et al., "Stealing Knowledge from Pre-trained Language Models for Heterogeneous Federated
Learning"): a frozen classifier built from a language model's concept distributions (LKCC) and a
server-side conditional generator that calibrates the local feature extractors (CGDE).

LKCC (:class:`ConceptClassifier`). Class ``c`` has a Gaussian concept distribution ``N(mu_c,
diag(s2_c))`` in the encoder's 384-d space (:mod:`neurofed.trainer.concepts`). A classifier whose weight
vectors are drawn from these distributions, ``w_c ~ N(mu_c, s2_c)``, with temperature ``T`` on the
unit-norm projected feature ``f`` (a trainable projection layer maps the EEG features to 384-d) has
the cross-entropy ``-T w_y.f + log sum_j exp(T w_j.f)``. Its expectation over infinitely many
sampled classifiers (infinitely many prompts) is bounded, by Jensen and the Gaussian moment
generating function ``E exp(T w.f) = exp(T mu.f + T^2/2 f.diag(s2).f)``, by the surrogate

    L(f, y) = -T mu_y.f + log sum_j exp(T mu_j.f + T^2/2 sum_d s2_jd f_d^2).

Writing ``z_j = T mu_j.f + T^2/2 sum_d s2_jd f_d^2`` this is ``CE(z, y) + T^2/2 sum_d s2_yd f_d^2``:
the classifier's logits are ``z`` (also used at test time, as in the authors' code) and the second
term is a label-dependent penalty added as a loss term. ``mu``, ``s2`` and ``T`` are buffers of the
head (so checkpoints and exports carry the classifier); they are computed once by the server's setup,
travel down as server extras (``fedbm_cls.*``) and the server re-imposes them on the global state
after every aggregation, so they are never averaged and stay bit-identical.

CGDE (:class:`ConceptGenerator`). A conditional generator of pseudo *inputs* (EEG trials), ``x =
G(e, n)`` with ``e ~ N(mu_c, s2_c)`` a sampled concept embedding and ``n`` Gaussian noise: a
two-layer MLP (hidden size ``fedbm_gen_hidden``) to ``channels x times``. Inputs rather than
features because calibrating the feature extractor needs samples that pass *through* it (pseudo
features at its output would train only the projection layer), and EEGNet's input is small (21 x
320). Every ``fedbm_gen_every`` rounds the server trains it on the aggregated global model (eval
mode, frozen) with the paper's three terms: semantic (the surrogate loss above on the generated
batch; plain cross-entropy when LKCC is off), diversity (per class, mean over pairs of
``1 / (|x_i - x_j|_1 / |code_i - code_j|_1 + 1e-5)``) and distribution. Distribution: with standard
BN, the distance of each BN layer's batch input mean/variance to the global model's running
statistics (DeepInversion, as in the paper); batch-specific BN keeps no running statistics, so the
term uses the one population statistic NeuroFed's inputs have by construction: Euclidean alignment
makes every subject's mean trial covariance the identity, so the term is ``||mean_i X_i X_i^T / T -
I||_F / channels`` of the generated batch (needs nothing from any client). Clients add ``fedbm_gen_mix``
pseudo trials per step: their surrogate loss (separate forward pass, standard BN's running statistics frozen
during it) is added to the batch loss.
The generator's parameters are sent down (``fedbm_gen.*``) with its byte count and training seconds
recorded (``fedbm_gen.cost_*``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neurofed.trainer.concepts import ConceptError, ConceptStats, load_concepts
from neurofed.trainer.fl.api import Algorithm, Component, LocalHook, Param, RoundInputs, ServerRound
from neurofed.trainer.models.bn import bn_modules
from neurofed.trainer.models.heads import ConceptHead
from neurofed.trainer.perturb import frozen_bn_stats

CLS = "fedbm_cls"
GEN = "fedbm_gen"


def surrogate_loss(head: ConceptHead, z: Tensor, y: Tensor) -> Tensor:
    """The infinite-prompt surrogate ``CE(logits, y) + penalty`` on features ``z``."""
    f = head.embed(z)
    return F.cross_entropy(head.logits_of(f), y) + head.penalty(f, y)


def model_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The surrogate if the model has a concept head, else cross-entropy (FedBM without LKCC)."""
    z = model.features(x)
    if isinstance(model.classifier, ConceptHead):
        return surrogate_loss(model.classifier, z, y)
    return F.cross_entropy(model.classifier(z), y)


def _class_names(settings: Mapping[str, Any]) -> list[str]:
    names = [c.strip() for c in str(settings["fedbm_classes"]).split(",")]
    for c in names:
        if not c:
            raise ConceptError(f"fedbm_classes {settings['fedbm_classes']!r} has an empty class name")
    return names


def concept_extras(stats: ConceptStats, temperature: float) -> dict[str, Tensor]:
    """The frozen classifier as server extras."""
    return {f"{CLS}.mean": torch.from_numpy(stats.mean.copy()), f"{CLS}.var": torch.from_numpy(stats.var.copy()),
            f"{CLS}.temperature": torch.tensor(float(temperature))}


def install_head(model: nn.Module, extras: Mapping[str, Tensor]) -> ConceptHead:
    """Give ``model`` a concept head from the classifier extras (validated against the model)."""
    missing = [k for k in ("mean", "var", "temperature") if f"{CLS}.{k}" not in extras]
    if missing:
        raise ConceptError(f"frozen concept classifier incomplete: no {', '.join(f'{CLS}.{k}' for k in missing)}")
    mean, var, t = extras[f"{CLS}.mean"], extras[f"{CLS}.var"], extras[f"{CLS}.temperature"]
    if mean.ndim != 2 or var.shape != mean.shape or t.numel() != 1:
        raise ConceptError(f"frozen classifier of shapes {tuple(mean.shape)}, {tuple(var.shape)}, "
                           f"{tuple(t.shape)}: need (C, D) twice and a scalar temperature")
    n_classes = getattr(model, "n_classes", None)
    if n_classes is not None and mean.shape[0] != n_classes:
        raise ConceptError(f"the frozen classifier has {mean.shape[0]} classes, the model {n_classes}")
    old = model.classifier
    in_features = old.projection.in_features if isinstance(old, ConceptHead) else old.in_features
    head = ConceptHead(in_features, mean, var, float(t))
    model.classifier = head
    return head


def check_head(model: nn.Module, extras: Mapping[str, Tensor]) -> None:
    """Refuse a downlinked classifier that does not fit the client's model; load it bit-exactly."""
    head = model.classifier
    mean = extras.get(f"{CLS}.mean")
    if not isinstance(head, ConceptHead) or mean is None:
        raise ConceptError("FedBM round without a frozen concept classifier (model head or task extras missing)")
    if tuple(mean.shape) != tuple(head.mean.shape):
        raise ConceptError(f"the task's frozen classifier has shape {tuple(mean.shape)}, "
                           f"the model's {tuple(head.mean.shape)} ({head.n_classes} classes)")
    with torch.no_grad():
        head.mean.copy_(mean)
        head.var.copy_(extras[f"{CLS}.var"])
        head.temperature.copy_(extras[f"{CLS}.temperature"])


class _LabelledHook(LocalHook):
    """Sees each step's labels (through :meth:`adversarial`, called right before the loss)."""

    needs_features = True

    def __init__(self) -> None:
        self.yb: Tensor | None = None

    def adversarial(self, model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        self.yb = yb
        return xb


class _ClassifierHook(_LabelledHook):
    def __init__(self, head: ConceptHead) -> None:
        super().__init__()
        self.head = head

    def loss_term(self, xb: Tensor, z: Tensor | None) -> Tensor | None:
        assert z is not None and self.yb is not None
        return self.head.penalty(self.head.embed(z), self.yb)


class _ClassifierRound(ServerRound):
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys

    def finish(self, old_global, new_global, extras, n_updates):
        out = dict(new_global)
        for k in self.keys:  # never averaged: the setup's classifier, bit-exactly
            out[k] = extras[f"{CLS}.{k.rsplit('.', 1)[1]}"].clone()
        return out, extras


class ConceptClassifier(Component):
    """LKCC: the frozen concept classifier (server extra ``fedbm_cls.*`` + head buffers re-imposed)."""

    PARAMS = (Param("fedbm_temperature", float, 0.0, "FedBM LKCC: temperature T of the frozen concept classifier "
                    "(0 = off)"),
              Param("fedbm_classes", str, "left_fist,right_fist", "FedBM: class names (comma list, model order) "
                    "whose concepts the language model embeds", minimum=None))
    KEY = CLS

    def __init__(self, temperature: float, classes: list[str]) -> None:
        self.temperature, self.classes = temperature, classes
        self.head_keys: list[str] = []

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> ConceptClassifier | None:
        t = settings["fedbm_temperature"]
        return cls(t, _class_names(settings)) if t > 0 else None

    def setup(self, model: nn.Module) -> dict[str, Tensor]:
        extras = concept_extras(load_concepts(self.classes), self.temperature)
        install_head(model, extras)
        self.head_keys = [f"classifier.{b}" for b in ("mean", "var", "temperature")]
        return extras

    def downlink_extras(self, server_extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {k: v for k, v in server_extras.items() if k.startswith(CLS + ".")}

    def prepare_model(self, model: nn.Module, server_extras: Mapping[str, Tensor]) -> None:
        """A freshly built (edge) model gets the task's frozen head; it must fit the model's class count."""
        if f"{CLS}.mean" not in server_extras:
            raise ConceptError(f"FedBM round without the frozen concept classifier ({CLS}.*) in the task extras")
        if not isinstance(model.classifier, ConceptHead):
            install_head(model, server_extras)
        check_head(model, server_extras)

    def local_round(self, model: nn.Module, kept, inputs: RoundInputs) -> LocalHook:
        check_head(model, inputs.server_extras)
        return _ClassifierHook(model.classifier)

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound:
        return _ClassifierRound(self.head_keys or [f"classifier.{b}" for b in ("mean", "var", "temperature")])


# ----------------------------------------------------------------------------------------------- CGDE
class ConditionalGenerator(nn.Module):
    """``x = G(e, n)``: concept embedding ``e`` (D) and noise ``n`` -> a pseudo trial (channels, times)."""

    NOISE_DIM = 16

    def __init__(self, embed_dim: int, n_channels: int, n_times: int, hidden: int, noise_dim: int = NOISE_DIM) -> None:
        super().__init__()
        self.noise_dim, self.n_channels, self.n_times = noise_dim, n_channels, n_times
        self.net = nn.Sequential(nn.Linear(embed_dim + noise_dim, hidden), nn.ELU(),
                                 nn.Linear(hidden, n_channels * n_times))

    def forward(self, e: Tensor, n: Tensor) -> tuple[Tensor, Tensor]:
        """Returns ``(code, x)``: the conditioning input ``[e, n]`` and the trials."""
        code = torch.cat([e, n], 1)
        return code, self.net(code).view(len(e), self.n_channels, self.n_times)


def sample_codes(mean: Tensor, var: Tensor, y: Tensor, noise_dim: int) -> tuple[Tensor, Tensor]:
    """Concept embeddings ``e ~ N(mu_y, s2_y)`` and noise for labels ``y`` (global torch RNG)."""
    e = mean[y] + var[y].sqrt() * torch.randn(len(y), mean.shape[1])
    return e, torch.randn(len(y), noise_dim)


def diversity_loss(codes: Tensor, x: Tensor, y: Tensor, n_classes: int) -> Tensor:
    """Mean over classes of ``mean_pairs 1 / (|x_i - x_j|_1 / |code_i - code_j|_1 + 1e-5)`` (mode-seeking)."""
    total = x.new_zeros(())
    for c in range(n_classes):
        m = y == c
        if int(m.sum()) > 1:
            ratio = F.pdist(x[m].flatten(1), p=1) / F.pdist(codes[m], p=1)
            total = total + torch.mean(1.0 / (ratio + 1e-5))
    return total / n_classes


def alignment_prior_loss(x: Tensor) -> Tensor:
    """``||mean_i X_i X_i^T / T - I||_F / channels``: EA makes the population mean covariance the identity."""
    cov = torch.einsum("bct,bdt->cd", x, x) / (x.shape[0] * x.shape[2])
    return torch.linalg.matrix_norm(cov - torch.eye(x.shape[1])) / x.shape[1]


class _BNStatHook:
    """Distance of a BN layer's batch input statistics to its running statistics (DeepInversion)."""

    def __init__(self, module: nn.Module) -> None:
        self.loss: Tensor | None = None
        self.handle = module.register_forward_hook(self._fn)

    def _fn(self, module, inputs, output) -> None:
        x = inputs[0]
        dims = [d for d in range(x.ndim) if d != 1]
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        self.loss = torch.norm(module.running_mean - mean, 2) + torch.norm(module.running_var - var, 2)


def generator_losses(model: nn.Module, gen: ConditionalGenerator, mean: Tensor, var: Tensor, y: Tensor,
                     ) -> dict[str, Tensor]:
    """The three CGDE terms on one generated batch (``model`` frozen, in eval mode)."""
    bns = [m for m in bn_modules(model).values() if m.track_running_stats]
    hooks = [_BNStatHook(m) for m in bns]
    try:
        e, n = sample_codes(mean, var, y, gen.noise_dim)
        codes, x = gen(e, n)
        semantic = model_loss(model, x, y)
        if hooks:
            distribution = sum(h.loss for h in hooks if h.loss is not None)
        else:
            distribution = alignment_prior_loss(x)
        diversity = diversity_loss(codes, x, y, mean.shape[0])
    finally:
        for h in hooks:
            h.handle.remove()
    return {"semantic": semantic, "diversity": diversity, "distribution": distribution}


def _gen_params(extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k[len(GEN) + 5:]: v for k, v in extras.items() if k.startswith(f"{GEN}.net.")}


class _GeneratorHook(_LabelledHook):
    def __init__(self, model: nn.Module, gen: ConditionalGenerator, mean: Tensor, var: Tensor, mix: int) -> None:
        super().__init__()
        self.model, self.gen, self.mean, self.var, self.mix = model, gen, mean, var, mix

    def loss_term(self, xb: Tensor, z: Tensor | None) -> Tensor | None:
        y = torch.randint(0, self.mean.shape[0], (self.mix,))
        with torch.no_grad():
            _, x = self.gen(*sample_codes(self.mean, self.var, y, self.gen.noise_dim))
        # pseudo trials must not move standard BN's running statistics: the model is tested on real trials with
        # them (they would drift towards the generator's statistics, 8 pseudo trials per step)
        with frozen_bn_stats(self.model):
            return model_loss(self.model, x, y)


class _GeneratorRound(ServerRound):
    def __init__(self, comp: ConceptGenerator) -> None:
        self.comp = comp

    def finish(self, old_global, new_global, extras, n_updates):
        step = int(extras.get(f"{GEN}.round", torch.tensor(0))) + 1
        extras[f"{GEN}.round"] = torch.tensor(step)
        if step % self.comp.every == 0:
            self.comp.train_generator(new_global, extras, step)
        return new_global, extras


class ConceptGenerator(Component):
    """CGDE: the server trains a conditional generator of pseudo trials; clients add its samples."""

    PARAMS = (
        Param("fedbm_gen_every", int, 0, "FedBM CGDE: retrain the generator every N rounds (0 = off)"),
        Param("fedbm_gen_hidden", int, 64, "FedBM CGDE: generator hidden units (its size)", minimum=1),
        Param("fedbm_gen_iters", int, 30, "FedBM CGDE: generator optimisation steps per update", minimum=1),
        Param("fedbm_gen_batch", int, 32, "FedBM CGDE: generated trials per generator step", minimum=2),
        Param("fedbm_gen_lr", float, 1e-3, "FedBM CGDE: generator Adam learning rate", minimum=1e-9),
        Param("fedbm_gen_mix", int, 8, "FedBM CGDE: pseudo trials a client adds per step", minimum=1),
        Param("fedbm_lambda_div", float, 1.0, "FedBM CGDE: weight of the diversity term"),
        Param("fedbm_lambda_dis", float, 0.1, "FedBM CGDE: weight of the distribution term"),
    )
    KEY = GEN

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.every = int(settings["fedbm_gen_every"])
        self.hidden = int(settings["fedbm_gen_hidden"])
        self.iters, self.batch = int(settings["fedbm_gen_iters"]), int(settings["fedbm_gen_batch"])
        self.lr, self.mix = float(settings["fedbm_gen_lr"]), int(settings["fedbm_gen_mix"])
        self.lam_div, self.lam_dis = float(settings["fedbm_lambda_div"]), float(settings["fedbm_lambda_dis"])
        self.classes = _class_names(settings)
        self.template: nn.Module | None = None
        self.stats: ConceptStats | None = None

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> ConceptGenerator | None:
        return cls(settings) if settings["fedbm_gen_every"] > 0 else None

    def new_generator(self, model: nn.Module) -> ConditionalGenerator:
        assert self.stats is not None
        return ConditionalGenerator(self.stats.mean.shape[1], model.n_channels, model.n_times, self.hidden)

    def setup(self, model: nn.Module) -> dict[str, Tensor]:
        self.stats = load_concepts(self.classes)
        if getattr(model, "n_classes", len(self.classes)) != len(self.classes):
            raise ConceptError(f"fedbm_classes names {len(self.classes)} classes, the model has {model.n_classes}")
        self.template = copy.deepcopy(model)
        gen = self.new_generator(model)  # drawn from the initial model's seeded RNG
        out = {f"{GEN}.net.{k}": v.detach().clone() for k, v in gen.net.state_dict().items()}
        nbytes = sum(v.numel() * v.element_size() for v in gen.parameters())
        out.update({f"{GEN}.ready": torch.tensor(0), f"{GEN}.cost_bytes": torch.tensor(float(nbytes)),
                    f"{GEN}.cost_seconds": torch.tensor(0.0), f"{GEN}.cost_updates": torch.tensor(0.0),
                    f"{GEN}.concept_mean": torch.from_numpy(self.stats.mean.copy()),
                    f"{GEN}.concept_var": torch.from_numpy(self.stats.var.copy())})
        return out

    def downlink_extras(self, server_extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
        keep = (f"{GEN}.net.", f"{GEN}.ready", f"{GEN}.concept_")
        return {k: v for k, v in server_extras.items() if k.startswith(keep)}

    def cached_extras(self) -> tuple[str, ...]:
        return (f"{GEN}.net.", f"{GEN}.concept_")  # over MQTT: sent when retrained, not every round

    def check_payload(self, model: nn.Module, extras: Mapping[str, Tensor]) -> None:
        """Refuse a downlinked generator (and its concept statistics) that does not fit ``model`` and
        ``fedbm_gen_hidden``: a clear :class:`ConceptError` naming the shapes (no RNG is drawn)."""
        missing = [k for k in (f"{GEN}.ready", f"{GEN}.concept_mean", f"{GEN}.concept_var") if k not in extras]
        if missing:
            raise ConceptError(f"FedBM CGDE round without {', '.join(missing)} in the task extras")
        mean, var = extras[f"{GEN}.concept_mean"], extras[f"{GEN}.concept_var"]
        n_classes = getattr(model, "n_classes", mean.shape[0] if mean.ndim else 0)
        if mean.ndim != 2 or var.shape != mean.shape or mean.shape[0] != n_classes:
            raise ConceptError(f"generator concept statistics of shapes {tuple(mean.shape)}, {tuple(var.shape)} "
                               f"do not fit the model: need ({n_classes}, D) twice")
        d_in, d_out = mean.shape[1] + ConditionalGenerator.NOISE_DIM, model.n_channels * model.n_times
        want = {"0.weight": (self.hidden, d_in), "0.bias": (self.hidden,), "2.weight": (d_out, self.hidden),
                "2.bias": (d_out,)}
        got = {k: tuple(v.shape) for k, v in _gen_params(extras).items()}
        if want != got:
            raise ConceptError(f"generator payload of shapes {got} does not fit the model "
                               f"({model.n_channels} x {model.n_times}, fedbm_gen_hidden {self.hidden}): "
                               f"expected {want}")

    def prepare_model(self, model: nn.Module, server_extras: Mapping[str, Tensor]) -> None:
        self.check_payload(model, server_extras)

    def _generator_from(self, model: nn.Module, extras: Mapping[str, Tensor]) -> ConditionalGenerator:
        self.check_payload(model, extras)
        mean = extras[f"{GEN}.concept_mean"]
        gen = ConditionalGenerator(mean.shape[1], model.n_channels, model.n_times, self.hidden)
        gen.net.load_state_dict(_gen_params(extras))
        gen.eval()
        return gen

    def local_round(self, model: nn.Module, kept, inputs: RoundInputs) -> LocalHook | None:
        ex = inputs.server_extras
        self.check_payload(model, ex)
        if not int(ex[f"{GEN}.ready"]):
            return None  # not trained yet
        gen = self._generator_from(model, ex)
        return _GeneratorHook(model, gen, ex[f"{GEN}.concept_mean"], ex[f"{GEN}.concept_var"], self.mix)

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound:
        return _GeneratorRound(self)

    def train_generator(self, global_state: Mapping[str, Tensor], extras: dict[str, Tensor], step: int) -> None:
        """Train the generator on the aggregated model (frozen, eval mode); update ``extras`` in place."""
        if self.template is None:
            raise ConceptError("CGDE generator training before setup (no model template)")
        t0 = time.perf_counter()
        model = copy.deepcopy(self.template)
        model.load_state_dict(dict(global_state))
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        gen = self._generator_from(model, extras)
        gen.train()
        mean, var = extras[f"{GEN}.concept_mean"], extras[f"{GEN}.concept_var"]
        opt = torch.optim.Adam(gen.parameters(), lr=self.lr, betas=(0.5, 0.999))
        with torch.random.fork_rng():
            torch.manual_seed(1_000_003 * step + 17)
            for _ in range(self.iters):
                y = torch.randint(0, mean.shape[0], (self.batch,))
                parts = generator_losses(model, gen, mean, var, y)
                loss = parts["semantic"] + self.lam_div * parts["diversity"] + self.lam_dis * parts["distribution"]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        extras.update({f"{GEN}.net.{k}": v.detach().clone() for k, v in gen.net.state_dict().items()})
        extras[f"{GEN}.ready"] = torch.tensor(1)
        extras[f"{GEN}.cost_seconds"] = extras[f"{GEN}.cost_seconds"] + (time.perf_counter() - t0)
        extras[f"{GEN}.cost_updates"] = extras[f"{GEN}.cost_updates"] + 1
        for k, v in parts.items():
            extras[f"{GEN}.stat_loss_{k}"] = v.detach().clone()


FEDBM = Algorithm(
    "fedbm", "frozen classifier from a local language model's concept Gaussians (LKCC, T 17.5) + projection "
    "layer; server-trained conditional generator of pseudo trials mixed into local training (CGDE, every 5 rounds)",
    (ConceptClassifier, ConceptGenerator), {"fedbm_temperature": 17.5, "fedbm_gen_every": 5},
    reference="Zhu et al., MICCAI 2024 / MedIA 2025")
