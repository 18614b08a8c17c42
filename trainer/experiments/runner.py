"""One training run (one fold, one seed): centralised (CT) or federated, in process.

The federated loop calls exactly the functions the MQTT coordinator and edge clients call
(:func:`neurofed.trainer.fl.server.select_clients`, :func:`~neurofed.trainer.fl.server.downlink`,
:func:`neurofed.trainer.fl.client.client_update`, :func:`~neurofed.trainer.fl.server.server_update`), with the
same per-(round, client) seeds, so both give the same weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn

from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.evaluate import attacked_predict, bca, predict
from neurofed.trainer.fl.byzantine import Byzantine
from neurofed.trainer.fl.client import ClientState, client_update, init_client_state
from neurofed.trainer.fl.init import client_seed, init_group_models, init_model, init_server_state
from neurofed.trainer.fl.local import LocalConfig, train_local
from neurofed.trainer.fl.server import (
    ServerState,
    downlink,
    select_clients,
    server_extras_for_clients,
    server_update,
)
from neurofed.trainer.fl.strategies import Strategy
from neurofed.trainer.fl.vectorised import (
    ENGINES,
    BatchedModel,
    ClientJob,
    unsupported,
    vectorised_updates,
    warn_once,
)

ProgressFn = Callable[[int, int, dict], None]


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


def _mean_bca(model: nn.Module | Mapping[str, nn.Module], spec: EvalSpec,
              groups: Mapping[str, str] | None = None) -> float:
    """Mean held-out BCA; with ``groups``, each subject is decoded by its group's model."""
    pick = (lambda sd: model[groups[sd.subject]]) if groups else (lambda sd: model)  # type: ignore[index]
    return float(np.mean([bca(sd.y, predict(pick(sd), sd.X, spec.test_batch)) for sd in spec.test]))


def run_centralised(
    train: Sequence[SubjectData], model_name: str, strategy: Strategy, cfg: LocalConfig, epochs: int, seed: int,
    spec: EvalSpec | None = None, progress: ProgressFn | None = None,
) -> tuple[nn.Module, dict]:
    """Centralised training (CT) on the pooled trials of ``train``; an epoch is one pass (batch ``cfg.batch_size``)."""
    spec = spec or EvalSpec()
    model = init_model(model_name, train[0], strategy.bn_mode, seed, **strategy.model_kwargs(model_name))
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
    groups: Mapping[str, str] | None = None,
    engine: str = "sequential",
) -> tuple[nn.Module, dict]:
    """Federated training in process (one client per subject).

    Returns the final released model (aggregated BN included; the global model, or the server's weight average
    when the strategy releases one: ``info["trained_states"]`` then holds the last global state per group and each
    learning-curve point also ``bca_global``) and ``{"curve": [...], "participation": {...}}``.
    ``server``/``client_states`` resume an interrupted run; ``byzantine`` makes a seeded fraction of the
    clients attack (robustness experiments, :mod:`neurofed.trainer.fl.byzantine`).

    ``groups`` (client id -> device profile, also every held-out subject's) is required by a
    hierarchical strategy (``strategy.group_prefixes``): each group gets its own architecture (its
    channel count), its clients receive the shared entries plus their group's module only, and
    ``info["models"]`` holds the final model of every group (the returned model is the first group's).

    ``engine``: ``sequential`` trains the round's clients one after the other (:func:`client_update`, what an edge
    client runs; the regression hashes are recorded on it); ``vectorised`` trains them together
    (:mod:`neurofed.trainer.fl.vectorised`: the same result to float tolerance, several times faster), falling
    back to the sequential path, with one log line, for what it does not know.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    spec = spec or EvalSpec()
    strategy.check_participation(fraction)
    ids = sorted(clients)
    prefixes = strategy.group_prefixes
    if prefixes and not groups:
        raise ValueError(f"strategy {strategy.name} aggregates {list(prefixes)} per client group: give each "
                         "client a device profile (--profiles)")
    groups = dict(groups) if prefixes else {cid: "" for cid in ids}
    models = init_group_models(clients, groups, model_name, strategy.bn_mode, seed, **strategy.model_kwargs(model_name))
    setup_extras: dict[str, Tensor] = {}
    for g in sorted(models):  # e.g. FedBM's frozen classifier (also on resume: it edits the models)
        setup_extras = strategy.setup(models[g]) or setup_extras
    if server is None:
        server = ServerState(init_server_state(models, prefixes), extras=setup_extras)
    states = client_states or {}
    for cid in ids:
        if cid not in states:
            states[cid] = init_client_state(server.global_state, models[groups[cid]], strategy, groups[cid])
    workers = {g: copy.deepcopy(m) for g, m in models.items()}
    participation = {cid: 0 for cid in ids}
    attackers = set(byzantine.attackers(ids)) if byzantine is not None else set()
    curve = []

    def load_final(released: bool = True) -> None:
        state = strategy.released_state(server.global_state, server.extras) if released else server.global_state
        for g, m in models.items():
            m.load_state_dict(strategy.client_view(state, g))

    eval_groups = groups if prefixes else None
    batched = None
    if engine == "vectorised":
        why = unsupported(workers[min(workers)], strategy)
        if why is None:
            ref = clients[ids[0]]
            batched = BatchedModel(workers[min(workers)], tuple(ref.X.shape[1:]))
        else:
            warn_once(why)
    while server.round < rounds:
        r = server.round
        chosen = select_clients(ids, fraction, r, seed)
        downs = {g: downlink(server.global_state, strategy, models[g], g) for g in sorted({groups[c] for c in chosen})}
        extras = server_extras_for_clients(server, strategy)
        updates = []
        labels = {cid: byzantine.labels(clients[cid].y, len(clients[cid].classes)) if cid in attackers
                  else clients[cid].y for cid in chosen}
        together = None
        if batched is not None:
            jobs = [ClientJob(downs[groups[c]], states[c], clients[c].X, labels[c], client_seed(seed, r, c), groups[c])
                    for c in chosen]
            together = vectorised_updates(workers[""], jobs, strategy, cfg, extras, batched)
        for i, cid in enumerate(chosen):
            sd, g = clients[cid], groups[cid]
            if together is not None:
                upd, states[cid] = together[i]
            else:
                upd, states[cid] = client_update(workers[g], downs[g], states[cid], sd.X, labels[cid], strategy, cfg,
                                                 client_seed(seed, r, cid), extras, g)
            if cid in attackers:
                upd = byzantine.poison(upd, server.global_state)
            updates.append((cid, upd))
            participation[cid] += 1
        server = server_update(server, updates, strategy, len(ids), rounds)
        point: dict = {"round": server.round, "loss": float(np.mean([u.metrics["loss"] for _, u in updates])),
                       "participants": len(chosen)}
        if spec.test and spec.every and (server.round % spec.every == 0 or server.round == rounds):
            load_final()
            point["bca"] = _mean_bca(models if prefixes else models[""], spec, eval_groups)
            if strategy.releases_average:  # the trained global model beside the released average
                load_final(released=False)
                point["bca_global"] = _mean_bca(models if prefixes else models[""], spec, eval_groups)
        curve.append(point)
        if progress:
            progress(server.round, rounds, point)
    trained = None
    if strategy.releases_average:  # the last trained global model (not released), for a paired comparison
        load_final(released=False)
        trained = {g: global_state_of(m) for g, m in models.items()}
    load_final()
    first = models[min(models)]
    per_round = len(select_clients(ids, fraction, 0, seed))
    cost = {k: float(v) for k, v in server.extras.items() if (".cost_" in k or ".stat_" in k) and v.numel() == 1}
    return first, {"curve": curve, "participation": participation, "server": server, "client_states": states,
                   "models": models, "attackers": sorted(attackers), "server_cost": cost,
                   "trained_states": trained,
                   **strategy.report(len(ids), per_round, rounds)}


def global_state_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached copy of a model's state dict."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
