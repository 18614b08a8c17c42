"""The strategy interface: an algorithm is a BN rule plus a composition of components.

A :class:`Component` owns one idea of one algorithm (a SAM perturbation, a FedProx term, SCAFFOLD's
control variates, server momentum ...) and says, through optional hooks,

* what a client does locally each round (:meth:`Component.local_round` returns a
  :class:`LocalHook`: adversarial inputs, extra loss terms, weight perturbations, gradient
  corrections, and what it keeps and uploads when the round ends),
* which extra tensors travel up (:meth:`Component.upload_specs`, named and shaped, so the wire
  validation asks the strategy instead of hard-coding prefixes) and down
  (:meth:`Component.downlink_extras`),
* how the server aggregates them (:meth:`Component.server_round`, streaming, O(model) memory), and
  how much each client's update counts (:meth:`Component.reweighting`: trial counts unless, e.g.,
  GA keeps per-client weights).

A :class:`Strategy` is the frozen composition: a name, the BN rule (``bn_mode``, ``local_bn``,
``bn_sync``) and a flat mapping of parameter settings from which its active components are built.
Ablations stay one-flag overrides (``get_strategy("fedbs", sam_rho=0)``) and components compose
(``get_strategy("fedavg", sam_rho=0.1, prox_mu=0.01)``). The registry of algorithms is
:mod:`neurofed.trainer.fl.strategies`; the pure per-round functions that use this interface are
:mod:`neurofed.trainer.fl.client` and :mod:`neurofed.trainer.fl.server` (shared by the simulation and the MQTT
coordinator/edge clients).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from neurofed.trainer.fl.aggregate import StateAggregator, WeightedSum  # StateAggregator: re-exported
from neurofed.trainer.models import MODELS
from neurofed.trainer.models.bn import bn_state_keys

BN_MODES = ("standard", "batch_specific")
BN_SYNC = ("local", "stale_global")


@dataclass(frozen=True)
class TensorSpec:
    """Name-independent description of one tensor that travels on the wire."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def tensor_specs(tensors: Mapping[str, Tensor]) -> dict[str, TensorSpec]:
    """Specs of a tensor dict (shape, dtype per name)."""
    return {k: TensorSpec(tuple(v.shape), v.dtype) for k, v in tensors.items()}


def param_specs(model: nn.Module, prefix: str) -> dict[str, TensorSpec]:
    """One spec per trainable parameter, named ``<prefix>.<parameter name>``."""
    return {f"{prefix}.{n}": TensorSpec(tuple(p.shape), p.dtype) for n, p in model.named_parameters()}


#: server-side name of a client group's entry: ``@<group>/<state-dict key>``
GROUP_MARK = "@"


def group_key(group: str, key: str) -> str:
    """Where the server keeps ``key`` of ``group``'s module (``@unicorn8/local.0.1.weight``)."""
    return f"{GROUP_MARK}{group}/{key}"


def is_grouped(key: str, prefixes: Sequence[str]) -> bool:
    """Whether a client state-dict key is aggregated per group."""
    return any(key.startswith(p) for p in prefixes)


def group_view(global_state: Mapping[str, Tensor], group: str) -> dict[str, Tensor]:
    """One group's view of the server state: the shared entries plus that group's own, un-prefixed.

    Nothing of another group's module is in it.
    """
    mark = group_key(group, "")
    out = {k: v for k, v in global_state.items() if not k.startswith(GROUP_MARK)}
    out.update({k[len(mark):]: v for k, v in global_state.items() if k.startswith(mark)})
    return out


def groups_of(global_state: Mapping[str, Tensor]) -> list[str]:
    """The groups whose modules the server holds, sorted."""
    return sorted({k[1:].split("/", 1)[0] for k in global_state if k.startswith(GROUP_MARK)})


def strip(prefix: str, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Entries of ``tensors`` under ``<prefix>.``, with the prefix removed."""
    p = prefix + "."
    return {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}


@dataclass(frozen=True)
class Param:
    """One tunable setting of a strategy (becomes ``--name`` in the CLI and a key in federation.toml).

    Parameters
    ----------
    name : str
        Flat name, unique across all components (``sam_rho``, ``prox_mu`` ...).
    type : type
        ``float``, ``int``, ``bool`` or ``str``.
    default : Any
        The value that switches the component off (or its neutral value).
    help : str
        One line for ``--help`` and the docs.
    choices : tuple
        Allowed values (``str`` parameters).
    minimum : float or None
        Smallest allowed value (numeric parameters).
    flag : str or None
        CLI flag declaration if not ``--<name>`` (e.g. ``--local-bn/--shared-bn``).
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: float | None = 0.0
    flag: str | None = None

    def check(self, value: Any) -> Any:
        """Validate and coerce one value; raises ``ValueError`` naming the parameter."""
        if self.type is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{self.name} must be true or false, got {value!r}")
            return value
        if self.type in (int, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{self.name} must be a number, got {value!r}")
            value = self.type(value)
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"{self.name} must be >= {self.minimum:g}, got {value}")
            return value
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")
        return value


@dataclass
class RoundInputs:
    """What a client received this round, besides its data.

    Attributes
    ----------
    global_state : dict
        The downlinked global model (FedProx anchor, MOON's global representation).
    server_extras : dict
        Strategy tensors sent down (e.g. ``scaffold_c.<param>``).
    lr, momentum : float
        The client's optimiser settings (SCAFFOLD's step normaliser).
    """

    global_state: Mapping[str, Tensor] = field(default_factory=dict)
    server_extras: Mapping[str, Tensor] = field(default_factory=dict)
    lr: float = 0.0
    momentum: float = 0.0


class LocalHook:
    """One component's part in one client's round. Every hook is optional (the defaults do nothing).

    The local-training step (:func:`neurofed.trainer.fl.local.train_local`) calls, for each mini-batch:
    :meth:`adversarial` (replace the inputs), the loss (cross-entropy + every :meth:`loss_term`),
    backward, then, if any :meth:`weight_delta` is not None, the gradient at the perturbed
    weights, then :meth:`correct` (edit gradients), then the optimiser step. After the round,
    :meth:`finish` returns the tensors to upload and what the client keeps.
    """

    #: the loss needs the model's features (``model.features``/``model.classifier``)
    needs_features: bool = False
    #: :meth:`finish` needs the eval-mode loss on the client's trials of the downlinked model (``metrics
    #: ["loss_global"]``, before local training) and of the trained model (``metrics["loss_local"]``) (GA)
    needs_local_loss: bool = False

    def adversarial(self, model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        return xb

    def loss_term(self, xb: Tensor, z: Tensor | None) -> Tensor | None:
        return None

    def weight_delta(self, params: Sequence[nn.Parameter]) -> list[Tensor | None] | None:
        return None

    def correct(self, params: Sequence[nn.Parameter]) -> None:
        return None

    def close(self) -> None:
        """Undo what the hook installed on the model (FedFA's forward hooks); :func:`neurofed.trainer.fl.local.train_local`
        calls it when its loop ends, also on error (so it runs in centralised training too)."""

    def finish(self, start: Mapping[str, Tensor], state: Mapping[str, Tensor],
               metrics: Mapping[str, float]) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
        """``(upload extras, new client-kept tensors or None to keep the old ones)``."""
        return {}, None


class ServerRound:
    """One component's part in aggregating one round (streaming: :meth:`add` sees each update once)."""

    def add(self, extras: Mapping[str, Tensor], n_samples: int) -> None:
        return None

    def finish(self, old_global: Mapping[str, Tensor], new_global: dict[str, Tensor],
               extras: dict[str, Tensor], n_updates: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Return ``(global state, server extras)`` after this component's rule."""
        return new_global, extras


class Reweighting:
    """One round's rule for how much each client's update counts (default: its trial count).

    The aggregation calls :meth:`weigh` once per accepted update, before adding it (it may also note
    the update's extras, e.g. GA's generalisation gap), then :meth:`finish` once with the new server
    extras. At most one component may reweight.
    """

    def weigh(self, client_id: str, extras: Mapping[str, Tensor], n_samples: int) -> float:
        return float(n_samples)

    def finish(self, extras: dict[str, Tensor], n_updates: int) -> dict[str, Tensor]:
        """Return the server extras after this round (e.g. the next round's weights)."""
        return extras


class Component:
    """A composable piece of a federated algorithm; subclasses override what they need.

    Class attributes
    ----------------
    PARAMS : tuple of Param
        The settings this component owns; :meth:`build` turns them into an instance (or None = off).
    KEY : str
        Namespace of the tensors it keeps on the client and on the server (``<KEY>.<name>``).
    """

    PARAMS: ClassVar[tuple[Param, ...]] = ()
    KEY: ClassVar[str] = ""

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> Component | None:
        raise NotImplementedError

    # setup (once, by whoever builds the initial global model: the simulation's server / the coordinator)
    def setup(self, model: nn.Module) -> dict[str, Tensor]:
        """Edit the freshly built model in place (e.g. FedBM's frozen concept head) before the initial
        global state is taken; return the initial server extras this component owns."""
        return {}

    # client side
    def prepare_model(self, model: nn.Module, server_extras: Mapping[str, Tensor]) -> None:
        """Shape a client's model from the downlinked extras before the global state is loaded into it
        (FedBM installs the frozen concept head a freshly built edge model lacks). Called every round,
        so it must be a no-op on a model it already shaped; extras that do not fit the model raise a
        :class:`~neurofed.trainer.errors.NeuroFedError` naming the mismatch (nothing is trained on them)."""

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook | None:
        """The hook for one round; ``kept`` is what this component stored on the client last time."""
        return None

    def upload_specs(self, model: nn.Module) -> dict[str, TensorSpec]:
        """Extra tensors a client uploads with its state (validated by the coordinator)."""
        return {}

    def grouped_keys(self) -> tuple[str, ...]:
        """State-dict key prefixes aggregated only among the clients of one group (device profile)."""
        return ()

    # server side
    def downlink_extras(self, server_extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Server-side tensors this component sends to the clients."""
        return {}

    def cached_extras(self) -> tuple[str, ...]:
        """Name prefixes of :meth:`downlink_extras` that are large and change rarely (FedBM's generator). Over
        MQTT they travel on a retained topic only when their content changes and a task names their hash; a
        client keeps the last copy. In process they are passed every round like the others (same values)."""
        return ()

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound | None:
        return None

    def state_aggregator(self, old_global: Mapping[str, Tensor], round_idx: int,
                         n_clients_total: int) -> StateAggregator | None:
        """Replace the weighted mean of the states (robust rules, DP); at most one component may."""
        return None

    def reweighting(self, server_extras: Mapping[str, Tensor], n_clients_total: int, round_idx: int,
                    rounds_total: int) -> Reweighting | None:
        """Replace the trial-count weight of each update (GA); at most one component may."""
        return None

    #: the rule needs every client in every round (GA): partial participation is refused
    needs_every_client: ClassVar[bool] = False

    def report(self, n_clients_total: int, per_round: int, rounds: int) -> dict[str, Any]:
        """Facts about a finished run this component vouches for (e.g. DP's epsilon), for results.json."""
        return {}

    def released_state(self, global_state: Mapping[str, Tensor],
                       server_extras: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """The model the server releases (evaluates, saves, exports) instead of the global state it trains on
        (server-side weight averaging); None: the global state itself. At most one component may."""
        return None


class ScalarComponent(Component):
    """A component switched on by its one parameter being > 0 (``PARAMS[0]``); by default its local hook is
    ``HOOK(value)`` (SAM, FAT, AWP), subclasses may build a richer one (FedProx)."""

    HOOK: ClassVar[type[LocalHook]]

    def __init__(self, value: float) -> None:
        self.value = value

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> Component | None:
        v = settings[cls.PARAMS[0].name]
        return cls(v) if v > 0 else None

    def local_round(self, model: nn.Module, kept: Mapping[str, Tensor] | None, inputs: RoundInputs) -> LocalHook | None:
        return self.HOOK(self.value)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Algorithm:
    """A registry entry: a named algorithm, its components and its default settings.

    Parameters
    ----------
    name : str
    summary : str
        One line for the docs' algorithm table and ``--help``.
    components : tuple of Component subclasses
        New component types this algorithm brings (an algorithm may also switch on others' by settings).
    settings : dict
        Parameter values (of any registered component or of the BN rule) that define it.
    reference : str
    centralised : bool
        Pooled training (CT), not federated.
    """

    name: str
    summary: str
    components: tuple[type[Component], ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    reference: str = ""
    centralised: bool = False


@dataclass(frozen=True)
class Strategy:
    """A federated algorithm as configured: the BN rule and its active components.

    Build it with :func:`neurofed.trainer.fl.strategies.get_strategy`.

    Attributes
    ----------
    name : str
    settings : dict
        Every registered parameter's value (``bn_mode``, ``local_bn``, ``bn_sync``, ``sam_rho`` ...).
    components : tuple of Component
        The active components, in registry order (the order loss terms and perturbations compose).
    centralised : bool
    """

    name: str
    settings: Mapping[str, Any]
    components: tuple[Component, ...] = ()
    centralised: bool = False

    # ------------------------------------------------------------------ the BN rule
    @property
    def bn_mode(self) -> str:
        return self.settings["bn_mode"]

    @property
    def local_bn(self) -> bool:
        return bool(self.settings["local_bn"])

    @property
    def bn_sync(self) -> str:
        return self.settings["bn_sync"]

    def model_kwargs(self, model: str) -> dict[str, str | float]:
        """Constructor arguments the strategy gives ``model`` besides ``bn_mode`` (the simulation, the coordinator and
        the edge clients all build from this; a checkpoint records them): ``local_bn_mode`` of ``fleeg_eegnet`` and
        ``dropout`` of a deep model, each only when set.

        Raises
        ------
        ValueError
            ``local_bn_mode`` set for a model without a per-device module; ``dropout`` outside [0, 1) (or -1), or set
            for a model without dropout layers.
        """
        out: dict[str, str | float] = {}
        lbn = self.settings.get("local_bn_mode") or ""
        if lbn:
            if model != "fleeg_eegnet":
                raise ValueError(f"local_bn_mode applies to model fleeg_eegnet only, not {model!r}")
            out["local_bn_mode"] = lbn
        p = float(self.settings.get("dropout", -1.0))
        if p != -1.0:
            if not 0.0 <= p < 1.0:
                raise ValueError(f"dropout must be in [0, 1) (or -1: the model's own), got {p:g}")
            if hasattr(MODELS.get(model), "local_fit"):  # a classical pipeline, fitted from sums: no dropout layer
                raise ValueError(f"dropout applies to the deep models, not {model!r}")
            out["dropout"] = p
        return out

    @property
    def group_prefixes(self) -> tuple[str, ...]:
        """Key prefixes aggregated per client group (empty: one federation-wide average)."""
        return tuple(dict.fromkeys(p for c in self.components for p in c.grouped_keys()))

    def client_view(self, global_state: Mapping[str, Tensor], group: str = "") -> dict[str, Tensor]:
        """The full model state of a client of ``group``: the shared entries and its group's module."""
        if not self.group_prefixes:
            return dict(global_state)
        view = group_view(global_state, group)
        if not any(is_grouped(k, self.group_prefixes) for k in view):
            raise ValueError(f"the server holds no module for client group {group!r} "
                             f"(groups: {', '.join(groups_of(global_state)) or 'none'})")
        return view

    def downlink(self, global_state: Mapping[str, Tensor], model: nn.Module, group: str = "") -> dict[str, Tensor]:
        """What the server sends to a client of ``group``: its view (:meth:`client_view`), minus BN
        entries under the local-BN rule (FedBN/FedBS). ``model`` is that group's architecture."""
        if self.group_prefixes:
            global_state = self.client_view(global_state, group)
        if self.local_bn and self.bn_sync == "local":
            drop = bn_state_keys(model)
            return {k: v for k, v in global_state.items() if k not in drop}
        return dict(global_state)

    def setup(self, model: nn.Module) -> dict[str, Tensor]:
        """Every component's :meth:`Component.setup` on the initial model; returns the initial server extras."""
        out: dict[str, Tensor] = {}
        for c in self.components:
            out.update(c.setup(model))
        return out

    def prepare_model(self, model: nn.Module, server_extras: Mapping[str, Tensor]) -> None:
        """Every component's :meth:`Component.prepare_model` (client side, before the downlink is loaded)."""
        for c in self.components:
            c.prepare_model(model, server_extras)

    # ------------------------------------------------------------------ wire
    def upload_specs(self, model: nn.Module) -> dict[str, TensorSpec]:
        """Extra tensors a client must upload (besides its state dict)."""
        out: dict[str, TensorSpec] = {}
        for c in self.components:
            out.update(c.upload_specs(model))
        return out

    @property
    def cached_prefixes(self) -> tuple[str, ...]:
        """Prefixes of the downlink extras sent only when they change (:meth:`Component.cached_extras`)."""
        return tuple(dict.fromkeys(p for c in self.components for p in c.cached_extras()))

    def downlink_extras(self, server_extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Server-side tensors the clients need this round."""
        out: dict[str, Tensor] = {}
        for c in self.components:
            out.update(c.downlink_extras(server_extras))
        return out

    # ------------------------------------------------------------------ client
    def local_hooks(self, model: nn.Module, kept: Mapping[str, Mapping[str, Tensor]],
                    inputs: RoundInputs) -> list[tuple[str, LocalHook]]:
        """One hook per component that acts locally, with the key of what it keeps."""
        hooks = []
        for c in self.components:
            h = c.local_round(model, kept.get(c.KEY), inputs)
            if h is not None:
                hooks.append((c.KEY, h))
        return hooks

    # ------------------------------------------------------------------ server
    def server_rounds(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> list[ServerRound]:
        """Each component's part of the round's aggregation, in registry order, except that a component that
        averages the released model (:meth:`released_state`) goes last: it averages the round's final state."""
        out = []
        for c in sorted(self.components, key=lambda c: type(c).released_state is not Component.released_state):
            r = c.server_round(server_extras, n_clients_total)
            if r is not None:
                out.append(r)
        return out

    def state_aggregator(self, old_global: Mapping[str, Tensor], round_idx: int,
                         n_clients_total: int) -> StateAggregator:
        """The rule that combines this round's states: a component's, else the trial-weighted mean."""
        for c in self.components:
            agg = c.state_aggregator(old_global, round_idx, n_clients_total)
            if agg is not None:
                return agg
        return WeightedSum()

    def reweighting(self, server_extras: Mapping[str, Tensor], n_clients_total: int, round_idx: int,
                    rounds_total: int) -> Reweighting:
        """How much each update of this round counts: a component's rule, else its trial count."""
        for c in self.components:
            rw = c.reweighting(server_extras, n_clients_total, round_idx, rounds_total)
            if rw is not None:
                return rw
        return Reweighting()

    @property
    def needs_every_client(self) -> bool:
        """Whether a component needs every client in every round (GA)."""
        return any(c.needs_every_client for c in self.components)

    def check_participation(self, fraction: float) -> None:
        """Raise ``ValueError`` if a component needs every client and ``fraction`` < 1."""
        if self.needs_every_client and fraction < 1:
            names = ", ".join(type(c).__name__ for c in self.components if c.needs_every_client)
            raise ValueError(f"strategy {self.name} ({names}) needs every client in every round: "
                             f"use fraction 1, got {fraction:g}")

    def released_state(self, global_state: Mapping[str, Tensor],
                       server_extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The server's released model (what is evaluated, saved, exported and published as final): a component's
        average (:mod:`neurofed.trainer.fl.algorithms.swa`), else the global state the clients train from."""
        for c in self.components:
            out = c.released_state(global_state, server_extras)
            if out is not None:
                return out
        return dict(global_state)

    @property
    def releases_average(self) -> bool:
        """Whether the released model differs from the trained global state (a component replaces it)."""
        return any(type(c).released_state is not Component.released_state for c in self.components)

    def report(self, n_clients_total: int, per_round: int, rounds: int) -> dict[str, Any]:
        """Every component's facts about a run of ``rounds`` rounds with ``per_round`` of ``n_clients_total``."""
        out: dict[str, Any] = {}
        for c in self.components:
            out.update(c.report(n_clients_total, per_round, rounds))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Name and every setting (results.json, the coordinator's fingerprint)."""
        return {"name": self.name, **dict(self.settings)}
