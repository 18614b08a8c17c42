"""In-process simulation of buffered asynchronous federation (``neurofed simulate --mode async``).

An event-driven loop over simulated time (arbitrary units) drives :class:`neurofed.trainer.fl.fedbuff.BufferedServer`
with the same client round as the synchronous runs (:func:`neurofed.trainer.fl.client.client_update`, the sequential
path an edge client runs).

The availability model (seeded per client, so a run is reproducible):

* each client alternates online sessions and offline gaps; session lengths are exponential with mean
  ``session_mean``, gaps exponential with mean ``session_mean * (1 - F) / F`` so the long-run online fraction is
  ``F`` (``online_fraction``; F = 1: always online). At time 0 a client is online with probability F, else in a gap
  (exponential, same mean); the draws come from ``numpy.random.default_rng([seed, 55, client index])``;
* while online a client loops: fetch the current model, train for ``train_time`` units, submit; an update whose
  training would end after the session ends is lost (the headset went off) and counted as ``lost_offline``: that
  training never finishes, so it is not computed and what the client keeps between rounds (its local BatchNorm
  under FedBS/SAFE/FedBN) stays as the last finished training left it;
* the store grows between sessions: with ``reveal`` R > 0 the client's k-th session (k = 0, 1, ...) sees its first
  ``min(n, R (k + 1))`` trials in recorded order; with ``window`` W > 0 it trains on the newest W of them (all when
  0); the update's trial count (its weight) is the number it trained on. A store with fewer than two trials trains
  nothing (BatchNorm needs two).

At one instant, arrivals are handled before fetches (in client order), so with every client always online, a
constant training time and K = number of clients every update has staleness 0 and each aggregation is the
synchronous FedAvg round of every client (the equivalence anchor, tests/trainer/experiments/test_asyncsim.py).
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np
from torch import nn

from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.client import client_update, init_client_state
from neurofed.trainer.fl.fedbuff import (
    STALE,
    BufferedServer,
    async_clip_mult,
    async_seed,
    async_value_keys,
    check_async,
    window_bounds,
)
from neurofed.trainer.fl.init import init_group_models, init_server_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, downlink
from neurofed.trainer.fl.strategies import Strategy

__all__ = ["AsyncConfig", "Availability", "replay_async", "run_async", "window_bounds"]

_FOREVER = 1e12  # an always-online client's session length
_ARRIVE, _END, _FETCH = 0, 1, 2  # event kinds; at one instant arrivals first, then session ends, then fetches


@dataclass(frozen=True)
class AsyncConfig:
    """The asynchronous mode's settings (see the module docstring)."""

    buffer_k: int = 10
    max_staleness: int = 10
    online_fraction: float = 0.3
    session_mean: float = 10.0
    train_time: float = 1.0
    server_lr: float = 1.0
    reveal: int = 0
    window: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.online_fraction <= 1:
            raise NeuroFedError(f"online fraction must be in (0, 1], got {self.online_fraction}")
        if self.buffer_k < 1 or self.max_staleness < 0:
            raise NeuroFedError(f"need buffer K >= 1 and max staleness >= 0, got {self.buffer_k}, {self.max_staleness}")
        if self.session_mean <= 0 or self.train_time <= 0 or self.server_lr <= 0:
            raise NeuroFedError("session mean, training time and server learning rate must be > 0")
        if self.reveal < 0 or self.window < 0:
            raise NeuroFedError(f"reveal and window must be >= 0, got {self.reveal}, {self.window}")

    def to_dict(self) -> dict:
        return asdict(self)


class Availability:
    """One client's seeded online/offline sessions (exponential lengths; see the module docstring)."""

    def __init__(self, cfg: AsyncConfig, seed: int, index: int) -> None:
        self.rng = np.random.default_rng([seed, 55, index])
        self.on_mean = cfg.session_mean
        f = cfg.online_fraction
        self.off_mean = cfg.session_mean * (1 - f) / f
        self.starts_online = f >= 1 or bool(self.rng.random() < f)

    def session(self) -> float:
        return _FOREVER if self.off_mean == 0 else float(self.rng.exponential(self.on_mean))

    def gap(self) -> float:
        return float(self.rng.exponential(self.off_mean))


def _setup(clients: Mapping[str, SubjectData], model_name: str, strategy: Strategy, cfg: AsyncConfig, seed: int):
    """The initial model, the buffered server and every client's starting state (as the coordinator draws them)."""
    check_async(strategy)
    ids = sorted(clients)
    models = init_group_models(dict(clients), {cid: "" for cid in ids}, model_name, strategy.bn_mode, seed,
                               **strategy.model_kwargs(model_name))
    model = models[""]
    strategy.setup(model)
    start = init_server_state(models, ())
    buf = BufferedServer(ServerState(start), cfg.buffer_k, cfg.max_staleness, cfg.server_lr, async_clip_mult(strategy),
                         async_value_keys(start, downlink(start, strategy, model)))
    states = {cid: init_client_state(buf.server.global_state, model, strategy) for cid in ids}
    return ids, model, buf, states


def replay_async(
    clients: Mapping[str, SubjectData], model_name: str, strategy: Strategy, local: LocalConfig, cfg: AsyncConfig,
    seed: int, arrivals: list[tuple[str, int]],
) -> tuple[BufferedServer, list]:
    """The simulation for a fixed arrival order: ``arrivals`` lists ``(client, base version)`` of every update the
    server received, in order (e.g. an MQTT coordinator's log). Each client trains, in its own order, from the
    global model of the base version (its ``repeat``-th training from it, :func:`async_seed`) on the newest
    ``cfg.window`` trials of its store (``cfg.reveal`` is not used: the store as loaded), and the update is submitted
    to the same :class:`BufferedServer`. Returns the server and each submission's verdict."""
    ids, model, buf, states = _setup(clients, model_name, strategy, cfg, seed)
    worker = copy.deepcopy(model)
    versions = {buf.version: buf.server.global_state}  # every version (a stale base must still be trained from)
    repeats: dict[tuple[str, int], int] = {}
    verdicts = []
    for cid, base in arrivals:
        if base not in versions:
            raise NeuroFedError(f"arrival of {cid} from version {base}, which the server has not made")
        sd = clients[cid]
        lo, hi = window_bounds(len(sd.y), cfg.window)
        k = repeats.get((cid, base), 0)
        repeats[(cid, base)] = k + 1
        down = downlink(versions[base], strategy, model)
        upd, states[cid] = client_update(worker, down, states[cid], sd.X[lo:hi], sd.y[lo:hi], strategy, local,
                                         async_seed(seed, base, cid, k))
        v = buf.submit(cid, upd, base)
        verdicts.append(v)
        if v.aggregated:
            versions[buf.version] = buf.server.global_state
    return buf, verdicts


def run_async(
    clients: Mapping[str, SubjectData], model_name: str, strategy: Strategy, local: LocalConfig, aggregations: int,
    cfg: AsyncConfig, seed: int, evaluate: Callable[[nn.Module], float] | None = None, every: int = 0,
    progress: Callable[[int, int, dict], None] | None = None,
) -> tuple[nn.Module, dict]:
    """Run ``aggregations`` buffered aggregations; returns the final global model and the run's record.

    ``evaluate`` (model -> mean held-out BCA) runs every ``every`` aggregations and after the last. The record has
    ``curve`` (per aggregation: version, mean loss, updates used, mean staleness, simulated time, bca),
    ``participation`` (accepted updates per client) and ``async`` (updates submitted/accepted/used, rejected by
    code, lost offline, simulated time, measured online fraction, the settings).
    """
    ids, model, buf, states = _setup(clients, model_name, strategy, cfg, seed)
    worker = copy.deepcopy(model)
    avail = {cid: Availability(cfg, seed, i) for i, cid in enumerate(ids)}
    index = {cid: i for i, cid in enumerate(ids)}
    sessions = {cid: 0 for cid in ids}  # sessions begun
    session_end = {cid: 0.0 for cid in ids}
    repeats: dict[tuple[str, int], int] = {}
    pending: dict[str, tuple] = {}  # cid -> (update, base version)
    participation = {cid: 0 for cid in ids}
    counts = {"submitted": 0, "lost_offline": 0, "too_few_trials": 0}
    online_time = {cid: 0.0 for cid in ids}
    events: list[tuple[float, int, int, str]] = []
    for cid in ids:
        a = avail[cid]
        heapq.heappush(events, (0.0 if a.starts_online else a.gap(), _FETCH, index[cid], cid))
    curve: list[dict] = []
    staleness_now: list[int] = []
    losses: list[float] = []
    now = 0.0
    max_events = 200 * max(1, aggregations) * max(cfg.buffer_k, len(ids))

    def load_global() -> nn.Module:
        model.load_state_dict(buf.server.global_state)
        return model

    n_events = 0
    while buf.version < aggregations:
        if not events or n_events > max_events:
            raise NeuroFedError("the asynchronous simulation stalled (no client can fill the buffer): lower "
                                "--buffer-k or raise --online-fraction")
        n_events += 1
        now, kind, _, cid = heapq.heappop(events)
        if kind == _FETCH:
            if now >= session_end[cid]:  # a session begins
                length = avail[cid].session()
                session_end[cid] = now + length
                online_time[cid] += length
                sessions[cid] += 1
                heapq.heappush(events, (session_end[cid], _END, index[cid], cid))
            sd = clients[cid]
            seen = len(sd.y) if cfg.reveal == 0 else min(len(sd.y), cfg.reveal * sessions[cid])
            lo, _ = window_bounds(seen, cfg.window)
            if seen - lo < 2:
                counts["too_few_trials"] += 1
                continue  # nothing to train on this session: wait for the next one
            version, glob = buf.fetch()
            k = repeats.get((cid, version), 0)
            repeats[(cid, version)] = k + 1
            done = now + cfg.train_time
            if done >= session_end[cid]:  # the session ends before training does: the training never finishes,
                counts["lost_offline"] += 1  # so it is not computed and leaves the client's kept state as it was
                continue
            tseed = async_seed(seed, version, cid, k)
            down = downlink(glob, strategy, model)
            upd, states[cid] = client_update(worker, down, states[cid], sd.X[lo:seen], sd.y[lo:seen], strategy,
                                             local, tseed)
            pending[cid] = (upd, version)
            heapq.heappush(events, (done, _ARRIVE, index[cid], cid))
        elif kind == _ARRIVE:
            upd, base = pending.pop(cid)
            counts["submitted"] += 1
            verdict = buf.submit(cid, upd, base)
            if verdict.code == "accepted":
                participation[cid] += 1
                staleness_now.append(verdict.staleness)
                losses.append(upd.metrics["loss"])
            if now < session_end[cid]:  # still online: fetch and train again
                heapq.heappush(events, (now, _FETCH, index[cid], cid))
            if verdict.aggregated:
                point = {"round": buf.version, "loss": float(np.mean(losses)), "participants": len(losses),
                         "mean_staleness": float(np.mean(staleness_now)), "max_staleness": int(max(staleness_now)),
                         "time": now, "rejected_stale": buf.rejected[STALE]}
                staleness_now, losses = [], []
                if evaluate is not None and every and (buf.version % every == 0 or buf.version == aggregations):
                    point["bca"] = evaluate(load_global())
                curve.append(point)
                if progress:
                    progress(buf.version, aggregations, point)
        else:  # _END: the session is over; the next begins after a gap
            if now >= session_end[cid]:
                heapq.heappush(events, (now + avail[cid].gap(), _FETCH, index[cid], cid))
    # sessions still open are cut at the end of the run for the measured online fraction
    measured = float(np.mean([(online_time[c] - max(0.0, session_end[c] - now)) / now if now > 0 else 1.0
                              for c in ids]))
    info = {
        "curve": curve, "participation": participation, "server": buf.server, "client_states": states,
        "async": {**cfg.to_dict(), "aggregations": buf.version, "updates_accepted": buf.accepted,
                  "updates_used": int(sum(p["participants"] for p in curve)), "rejected": dict(buf.rejected),
                  "rejected_stale": buf.rejected[STALE], "clipped": buf.clipped, "sim_time": now,
                  "online_fraction_measured": measured, "sessions": int(sum(sessions.values())), **counts},
    }
    return load_global(), info
