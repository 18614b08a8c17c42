"""One client's round: merge the downlink with what stays local, train, build the upload."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from trainer.fl.local import LocalConfig, LocalContext, train_local
from trainer.fl.strategies import Strategy
from trainer.models.bn import bn_state_keys

_PREFIXES = {"bn": "bn.", "scaffold_c": "scaffold_c.", "moon_prev": "moon_prev."}


@dataclass
class ClientState:
    """What a client keeps between rounds (on the device, never uploaded as such).

    Attributes
    ----------
    bn : dict or None
        Its own BatchNorm entries (local-BN strategies).
    scaffold_c : dict or None
        SCAFFOLD client control variate ``c_i``.
    moon_prev : dict or None
        Its previous local model (MOON).
    """

    bn: dict[str, Tensor] | None = None
    scaffold_c: dict[str, Tensor] | None = None
    moon_prev: dict[str, Tensor] | None = None

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat tensor dict (for safetensors)."""
        out: dict[str, Tensor] = {}
        for attr, prefix in _PREFIXES.items():
            for k, v in (getattr(self, attr) or {}).items():
                out[prefix + k] = v.detach().contiguous()
        return out

    @classmethod
    def from_tensors(cls, flat: dict[str, Tensor]) -> ClientState:
        parts: dict[str, dict[str, Tensor]] = {}
        for k, v in flat.items():
            for attr, prefix in _PREFIXES.items():
                if k.startswith(prefix):
                    parts.setdefault(attr, {})[k[len(prefix):]] = v
        return cls(**parts)


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
        Strategy extras, e.g. ``scaffold_dc.<param>`` (control-variate change).
    metrics : dict
        ``loss``, ``steps``.
    """

    state: dict[str, Tensor]
    n_samples: int
    extras: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def init_client_state(global_state: dict[str, Tensor], model: nn.Module, strategy: Strategy) -> ClientState:
    """A new client's state: its BN starts from the initial global model (all clients start alike)."""
    st = ClientState()
    if strategy.local_bn:
        st.bn = {k: global_state[k].clone() for k in bn_state_keys(model)}
    return st


def momentum_displacement(k_steps: int, momentum: float) -> float:
    """How far K heavy-ball SGD steps (fresh momentum buffer, lr 1) move under a constant unit gradient.

    ``sum_{k=1..K} (1 - m^k) / (1 - m)``; equals ``K`` for plain SGD. SCAFFOLD's option-II control
    variate ``(x - y_i) / (K lr)`` assumes plain SGD; with momentum 0.9 the displacement after the
    ~12 local steps of our protocol is ~4.6x larger, the control variates ~4.6x too large, and
    training diverged (loss 1e5 after 12 rounds, BCA 50 % on every subject). Dividing by
    ``lr * momentum_displacement(K, m)`` makes ``c_i`` the client's mean gradient again (tested).
    """
    k = max(int(k_steps), 1)
    if momentum == 0:
        return float(k)
    return float(sum((1 - momentum ** j) / (1 - momentum) for j in range(1, k + 1)))


def client_update(
    model: nn.Module,
    down: dict[str, Tensor],
    client_state: ClientState,
    X: np.ndarray,
    y: np.ndarray,
    strategy: Strategy,
    cfg: LocalConfig,
    seed: int,
    server_extras: dict[str, Tensor] | None = None,
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
        ``scaffold_c.<param>`` (SCAFFOLD server control variate).

    Returns
    -------
    ClientUpdate, ClientState
    """
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

    ctx = LocalContext(global_state=down, moon_prev=client_state.moon_prev)
    if strategy.scaffold:
        c = {n[len("scaffold_c."):]: v for n, v in (server_extras or {}).items() if n.startswith("scaffold_c.")}
        c = c or {n: torch.zeros_like(p) for n, p in start.items()}
        ci = client_state.scaffold_c or {n: torch.zeros_like(p) for n, p in start.items()}
        ctx.scaffold_c, ctx.scaffold_ci = c, ci
    metrics = train_local(model, X, y, strategy, cfg, seed, ctx)

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    extras: dict[str, Tensor] = {}
    new = ClientState(bn=client_state.bn, scaffold_c=client_state.scaffold_c, moon_prev=client_state.moon_prev)
    if strategy.local_bn:
        new.bn = {k: state[k].clone() for k in bn_state_keys(model)}
    if strategy.scaffold:
        step = cfg.lr * momentum_displacement(int(metrics["steps"]), cfg.momentum)
        ci_new = {n: ctx.scaffold_ci[n] - ctx.scaffold_c[n] + (start[n] - state[n]) / step for n in start}
        extras = {f"scaffold_dc.{n}": ci_new[n] - ctx.scaffold_ci[n] for n in start}
        new.scaffold_c = ci_new
    if strategy.moon_mu > 0:
        new.moon_prev = {k: v.clone() for k, v in state.items()}
    return ClientUpdate(state, len(X), extras, metrics), new
