"""One client's round: merge the downlink with what stays local, train, build the upload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor, nn

from neurofed.trainer.evaluate import mean_loss
from neurofed.trainer.fl.algorithms.scaffold import momentum_displacement  # noqa: F401  (public: tests, docs)
from neurofed.trainer.fl.api import LocalHook, RoundInputs, Strategy
from neurofed.trainer.fl.local import LocalConfig, train_local
from neurofed.trainer.models.bn import bn_state_keys


@dataclass
class ClientState:
    """What a client keeps between rounds (on the device, never uploaded as such).

    Attributes
    ----------
    bn : dict or None
        Its own BatchNorm entries (local-BN strategies).
    parts : dict
        What each component keeps, by the component's key (``scaffold_c``: SCAFFOLD's ``c_i``;
        ``moon_prev``: MOON's previous local model). ``state.scaffold_c`` reads ``parts["scaffold_c"]``.
    """

    bn: dict[str, Tensor] | None = None
    parts: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> dict[str, Tensor] | None:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__dict__.get("parts", {}).get(name)

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat tensor dict (for safetensors): ``bn.<key>`` and ``<component key>.<key>``."""
        out = {f"bn.{k}": v.detach().contiguous() for k, v in (self.bn or {}).items()}
        for part, tensors in self.parts.items():
            out.update({f"{part}.{k}": v.detach().contiguous() for k, v in tensors.items()})
        return out

    @classmethod
    def from_tensors(cls, flat: Mapping[str, Tensor]) -> ClientState:
        st = cls()
        for k, v in flat.items():
            part, _, rest = k.partition(".")
            if part == "bn":
                st.bn = {**(st.bn or {}), rest: v}
            else:
                st.parts.setdefault(part, {})[rest] = v
        return st


@dataclass
class ClientUpdate:
    """What a client uploads after a round.

    Attributes
    ----------
    state : dict
        Full state dict after local training (BN included: the server aggregates it).
    n_samples : int
        Trials trained on (aggregation weight).
    extras : dict
        Strategy extras (named by :meth:`Strategy.upload_specs`, e.g. ``scaffold_dc.<param>``).
    metrics : dict
        ``loss``, ``steps``.
    group : str
        The client's group (device profile) under a hierarchical strategy; ``""`` otherwise.
    """

    state: dict[str, Tensor]
    n_samples: int
    extras: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    group: str = ""


def init_client_state(global_state: Mapping[str, Tensor], model: nn.Module, strategy: Strategy,
                      group: str = "") -> ClientState:
    """A new client's state: its BN starts from the initial global model (all clients of a group start alike)."""
    st = ClientState()
    if strategy.local_bn:
        view = strategy.client_view(global_state, group)
        st.bn = {k: view[k].clone() for k in bn_state_keys(model)}
    return st


def client_update(
    model: nn.Module,
    down: Mapping[str, Tensor],
    client_state: ClientState,
    X: np.ndarray,
    y: np.ndarray,
    strategy: Strategy,
    cfg: LocalConfig,
    seed: int,
    server_extras: Mapping[str, Tensor] | None = None,
    group: str = "",
) -> tuple[ClientUpdate, ClientState]:
    """Run one round on a client.

    Parameters
    ----------
    model : nn.Module
        Any instance of the architecture (its weights are overwritten).
    down : dict
        The downlinked global state (without BN entries under FedBS's rule).
    client_state : ClientState
        What this client kept from earlier rounds (see :func:`init_client_state`).
    X, y : ndarray
        The client's own trials.
    strategy, cfg, seed
        Algorithm, optimiser settings, and the seed for shuffling and dropout this round.
    server_extras : dict, optional
        Strategy tensors sent down (:meth:`Strategy.downlink_extras`, e.g. SCAFFOLD's ``c``).
    group : str
        The client's group (device profile) under a hierarchical strategy; stamped on the update.

    Returns
    -------
    ClientUpdate, ClientState
    """
    start, hooks = begin_client_round(model, down, client_state, strategy, server_extras or {}, cfg)
    local_loss = any(h.needs_local_loss for _, h in hooks)
    before = mean_loss(model, X, y, cfg.batch_size) if local_loss else 0.0
    metrics = train_local(model, X, y, strategy, cfg, seed, [h for _, h in hooks])
    if local_loss:  # GA: the downlinked and the trained model on the client's own trials
        metrics.update(loss_global=before, loss_local=mean_loss(model, X, y, cfg.batch_size))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return end_client_round(model, state, client_state, strategy, hooks, start, metrics, len(X), group)


def begin_client_round(
    model: nn.Module, down: Mapping[str, Tensor], client_state: ClientState, strategy: Strategy,
    server_extras: Mapping[str, Tensor], cfg: LocalConfig,
) -> tuple[dict[str, Tensor], list[tuple[str, LocalHook]]]:
    """A client's round before training: ``model`` shaped and loaded with the downlink merged with what the client
    kept; returns the starting parameters and this round's hooks (with the keys of what they keep).

    Shared by :func:`client_update` and the vectorised engine (:mod:`neurofed.trainer.fl.vectorised`).
    """
    strategy.prepare_model(model, server_extras)  # e.g. FedBM's head on a freshly built edge model
    keys = set(model.state_dict())
    full = {k: v.clone() for k, v in down.items()}
    missing = keys - full.keys()
    if missing:
        if client_state.bn is None or not missing <= client_state.bn.keys():
            raise ValueError(f"downlink lacks {sorted(missing)} and the client holds no local BN for them")
        full.update({k: client_state.bn[k].clone() for k in missing})
    unknown = full.keys() - keys
    if unknown:
        raise ValueError(f"downlink has keys the model does not: {sorted(unknown)}")
    model.load_state_dict(full, strict=True)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    inputs = RoundInputs(down, server_extras, cfg.lr, cfg.momentum)
    return start, strategy.local_hooks(model, client_state.parts, inputs)


def end_client_round(
    model: nn.Module, state: dict[str, Tensor], client_state: ClientState, strategy: Strategy,
    hooks: list[tuple[str, LocalHook]], start: Mapping[str, Tensor], metrics: dict[str, float], n_samples: int,
    group: str = "",
) -> tuple[ClientUpdate, ClientState]:
    """A client's round after training to ``state`` (``model``: the architecture, for its BN keys): the upload
    and what the client keeps."""
    new = ClientState(bn=client_state.bn, parts=dict(client_state.parts))
    if strategy.local_bn:
        new.bn = {k: state[k].clone() for k in bn_state_keys(model)}
    extras: dict[str, Tensor] = {}
    for key, hook in hooks:
        up, kept = hook.finish(start, state, metrics)
        extras.update(up)
        if kept is not None:
            new.parts[key] = kept
    return ClientUpdate(state, n_samples, extras, metrics, group), new
