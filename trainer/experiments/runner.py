"""One training run (one fold, one seed): centralised (CT) or federated, in process.

The federated loop calls exactly the functions the MQTT coordinator and edge clients call
(:func:`trainer.fl.server.select_clients`, :func:`~trainer.fl.server.downlink`,
:func:`trainer.fl.client.client_update`, :func:`~trainer.fl.server.server_update`), with the
same per-(round, client) seeds, so both give the same weights.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from trainer.data.dataset import SubjectData
from trainer.evaluate import attacked_predict, bca, predict
from trainer.fl.byzantine import Byzantine
from trainer.fl.client import ClientState, client_update, init_client_state
from trainer.fl.local import LocalConfig, train_local
from trainer.fl.server import ServerState, downlink, select_clients, server_extras_for_clients, server_update
from trainer.fl.strategies import Strategy
from trainer.models import build_model

ProgressFn = Callable[[int, int, dict], None]


def client_seed(seed: int, round_idx: int, client_id: str) -> int:
    """Seed of one client's local training in one round (same in-process and over MQTT)."""
    return int(np.random.SeedSequence([seed, round_idx, zlib.crc32(client_id.encode())]).generate_state(1)[0])


def init_model(model_name: str, ref: SubjectData, bn_mode: str, seed: int) -> nn.Module:
    """The initial global model: architecture for ``ref``'s shape, weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return build_model(model_name, ref.X.shape[1], len(ref.classes), ref.X.shape[2], ref.sfreq, bn_mode)


@dataclass
class EvalSpec:
    """What to measure on held-out subjects."""

    test: Sequence[SubjectData] = ()
    test_batch: int = 8
    every: int = 0  # evaluate the global model every N rounds (0 = only at the end)
    attacks: Sequence[tuple[str, float]] = ()


def evaluate_subjects(model: nn.Module, spec: EvalSpec, seed: int = 0) -> dict[str, dict[str, float]]:
    """Benign (and attacked) BCA per held-out subject."""
    out: dict[str, dict[str, float]] = {}
    for sd in spec.test:
        row = {"bca": bca(sd.y, predict(model, sd.X, spec.test_batch))}
        for attack, eps in spec.attacks:
            pred = attacked_predict(model, sd.X, sd.y, attack, eps, spec.test_batch, seed)
            row[f"{attack}@{eps:g}"] = bca(sd.y, pred)
        out[sd.subject] = row
    return out


def _mean_bca(model: nn.Module, spec: EvalSpec) -> float:
    return float(np.mean([bca(sd.y, predict(model, sd.X, spec.test_batch)) for sd in spec.test]))


def run_centralised(
    train: Sequence[SubjectData], model_name: str, strategy: Strategy, cfg: LocalConfig, epochs: int, seed: int,
    spec: EvalSpec | None = None, progress: ProgressFn | None = None,
) -> tuple[nn.Module, dict]:
    """Centralised training (CT) on the pooled trials of ``train``; an epoch is one pass (batch ``cfg.batch_size``)."""
    spec = spec or EvalSpec()
    model = init_model(model_name, train[0], strategy.bn_mode, seed)
    X = np.concatenate([sd.X for sd in train])
    y = np.concatenate([sd.y for sd in train])
    one_epoch = LocalConfig(cfg.lr, cfg.momentum, cfg.weight_decay, cfg.batch_size, 1)
    curve = []
    for ep in range(epochs):
        m = train_local(model, X, y, strategy, one_epoch, seed=seed * 100003 + ep)
        point = {"round": ep + 1, "loss": m["loss"]}
        if spec.test and spec.every and ((ep + 1) % spec.every == 0 or ep + 1 == epochs):
            point["bca"] = _mean_bca(model, spec)
        curve.append(point)
        if progress:
            progress(ep + 1, epochs, point)
    return model, {"curve": curve}


def run_federated(
    clients: dict[str, SubjectData], model_name: str, strategy: Strategy, cfg: LocalConfig, rounds: int,
    fraction: float, seed: int, spec: EvalSpec | None = None, progress: ProgressFn | None = None,
    server: ServerState | None = None, client_states: dict[str, ClientState] | None = None,
    byzantine: Byzantine | None = None,
) -> tuple[nn.Module, dict]:
    """Federated training in process (one client per subject).

    Returns the final global model (aggregated BN included) and ``{"curve": [...], "participation": {...}}``.
    ``server``/``client_states`` resume an interrupted run; ``byzantine`` makes a seeded fraction of the
    clients attack (robustness experiments, :mod:`trainer.fl.byzantine`).
    """
    spec = spec or EvalSpec()
    ids = sorted(clients)
    model = init_model(model_name, clients[ids[0]], strategy.bn_mode, seed)
    setup_extras = strategy.setup(model)  # e.g. FedBM's frozen classifier (also on resume: it edits the model)
    if server is None:
        server = ServerState({k: v.clone() for k, v in model.state_dict().items()}, extras=setup_extras)
    states = client_states or {}
    for cid in ids:
        if cid not in states:
            states[cid] = init_client_state(server.global_state, model, strategy)
    worker = copy.deepcopy(model)
    participation = {cid: 0 for cid in ids}
    attackers = set(byzantine.attackers(ids)) if byzantine is not None else set()
    curve = []
    while server.round < rounds:
        r = server.round
        chosen = select_clients(ids, fraction, r, seed)
        down = downlink(server.global_state, strategy, model)
        extras = server_extras_for_clients(server, strategy)
        updates = []
        for cid in chosen:
            sd = clients[cid]
            y = byzantine.labels(sd.y, len(sd.classes)) if cid in attackers else sd.y
            upd, states[cid] = client_update(
                worker, down, states[cid], sd.X, y, strategy, cfg, client_seed(seed, r, cid), extras
            )
            if cid in attackers:
                upd = byzantine.poison(upd, server.global_state)
            updates.append((cid, upd))
            participation[cid] += 1
        server = server_update(server, updates, strategy, len(ids))
        point: dict = {"round": server.round, "loss": float(np.mean([u.metrics["loss"] for _, u in updates])),
                       "participants": len(chosen)}
        if spec.test and spec.every and (server.round % spec.every == 0 or server.round == rounds):
            model.load_state_dict(server.global_state)
            point["bca"] = _mean_bca(model, spec)
        curve.append(point)
        if progress:
            progress(server.round, rounds, point)
    model.load_state_dict(server.global_state)
    per_round = len(select_clients(ids, fraction, 0, seed))
    cost = {k: float(v) for k, v in server.extras.items() if (".cost_" in k or ".stat_" in k) and v.numel() == 1}
    return model, {"curve": curve, "participation": participation, "server": server, "client_states": states,
                   "attackers": sorted(attackers), "server_cost": cost, **strategy.report(len(ids), per_round, rounds)}


def global_state_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached copy of a model's state dict."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
