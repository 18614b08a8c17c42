"""The coordinator's side of a secure-aggregation round (SecAgg+ over MQTT; maths in :mod:`neurofed.trainer.fl.secagg`).

With ``[federation] secure_aggregation = true`` every round is a :class:`SecAggRound` instead of a plain
:class:`~neurofed.broker.rounds.RoundState`. The coordinator routes messages it cannot read and learns only the sum:

1. **keys**: each selected client sends ``sa_keys`` (two fresh X25519 public keys). The phase ends when every
   selected client that is not offline has advertised, or after ``[secagg] phase_s`` (at most the deadline).
   Roster = the advertisers, sorted; each gets ``sa_roster`` (the roster's size, its index, the graph seed,
   ``k``, ``t`` and its neighbours' keys, in ascending index: the client derives who they are from the graph).
2. **shares**: each roster member sends ``sa_shares`` (one sealed share per neighbour; it has trained by then).
   The phase ends when every member that is not offline delivered, or at the round deadline. Members left with
   fewer than ``t`` sharing neighbours are dropped (repeatedly, until stable); each remaining one gets
   ``sa_inbox`` (the sealed shares its sharing neighbours sent it).
3. **masked**: each member sends ``sa_masked`` (its masked fixed-point update). Ends when all delivered or
   went offline, or at ``max(deadline, inbox + phase_s)``; each survivor gets ``sa_unmask`` (which of its
   neighbours survived and which dropped).
4. **unmask**: each survivor sends ``sa_reveal``; after all (or ``phase_s``) :func:`neurofed.trainer.fl.secagg.unmask`
   recovers the exact sum, which goes into the round's :class:`~neurofed.trainer.fl.server.RoundAggregator` as one
   update (the trial-weighted mean, weight = the survivors' trials): the same aggregation path as a plain round.

A round that cannot be unmasked (too few survivors or shares) ends with no update, so the coordinator re-issues
it like a round without enough updates. Every message is validated before it touches the round (codes
``secagg_phase``, ``bad_secagg``, plus the usual ``replay`` / ``late`` / ``wrong_task`` / ``not_selected`` /
``duplicate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from neurofed.broker import logger
from neurofed.broker.config import ConfigError, FederationConfig
from neurofed.broker.protocol import (
    COORDINATOR_ID,
    SaInboxMsg,
    SaRosterMsg,
    SaUnmaskMsg,
    SecAggSpec,
    Topics,
    encode,
)
from neurofed.broker.rounds import RoundState, SeenIds
from neurofed.broker.validation import Rejected
from neurofed.trainer.fl.aggregate import WeightedSum
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.secagg import (
    B_SHARE_LEN,
    KEY_LEN,
    KEY_SHARE_LEN,
    SEALED_LEN,
    SecAggError,
    Shares,
    b64,
    decode_update_sum,
    graph_params,
    masked_keys,
    max_weight_sum,
    neighbour_graph,
    unb64,
    unb64_records,
    unmask,
)


def check_compatible(cfg: FederationConfig, strategy: Any, model: torch.nn.Module) -> None:
    """Refuse, with one clear error, what needs single updates at the coordinator under secure aggregation."""
    name = cfg.federation.strategy
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if strategy.group_prefixes:
        raise ConfigError(f"secure_aggregation: strategy {name!r} averages per client group; secure aggregation "
                          "sums one federation-wide vector (not supported together)")
    if strategy.upload_specs(model):
        raise ConfigError(f"secure_aggregation: strategy {name!r} uploads extra tensors "
                          f"({', '.join(sorted(strategy.upload_specs(model))[:3])}) that its server rule needs per "
                          "client; use a strategy without uploads (fedavg, fedbn, fedbs, fedprox, fedavgm)")
    if type(strategy.state_aggregator(state, 0, 1)) is not WeightedSum:
        raise ConfigError(
            f"secure_aggregation: strategy {name!r} aggregates with a rule that needs every single update "
            "(robust aggregation, the adaptive norm clip, which is on by default with clip_mult = 1.5, or DP); the "
            "coordinator only learns the sum. Set strategy_overrides = { clip_mult = 0 } (aggregator = \"mean\", "
            "no dp_clip), and [validation] norm_bound > 0 to have every client clip its own update to that bound "
            "before masking")
    if cfg.validation.norm_bound > 0 and cfg.validation.norm_action == "reject":
        raise ConfigError("secure_aggregation: [validation] norm_action = \"reject\" needs single updates; use "
                          "\"clip\" (clients clip to norm_bound before masking)")


def secagg_spec(cfg: FederationConfig, n_trials: dict[str, int], chosen: list[str]) -> SecAggSpec:
    """The task's secure-aggregation settings: weights ``n_k / n_ref``, ``n_ref`` = the chosen clients' trials."""
    s = cfg.secagg
    return SecAggSpec(neighbours=s.neighbours, threshold=s.threshold, bound=s.bound,
                      n_ref=max(1, sum(n_trials.get(c, 0) for c in chosen)), norm_bound=cfg.validation.norm_bound)


@dataclass
class SecAggRound(RoundState):
    """A round under secure aggregation (see the module docstring for the four phases)."""

    federation: str = ""
    run_id: str = ""
    spec: SecAggSpec | None = None
    collect_s: float = 120.0   # the round deadline for the clients' shares (training happens before them)
    phase_s: float = 30.0
    graph_seed: int = 0
    send: Callable[[str, bytes], None] | None = None
    phase: str = "keys"
    keys: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # client -> (channel_pk, mask_pk)
    roster: list[str] = field(default_factory=list)
    rank: dict[str, int] = field(default_factory=dict)
    k: int = 0
    t: int = 0
    graph: dict[int, frozenset[int]] = field(default_factory=dict)
    sealed: dict[str, dict[int, bytes]] = field(default_factory=dict)  # sender -> {recipient index: sealed share}
    sharers: set[str] = field(default_factory=set)
    masked: dict[str, np.ndarray] = field(default_factory=dict)
    asked: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    reveals: dict[str, tuple[dict[str, bytes], dict[str, bytes]]] = field(default_factory=dict)  # b, key shares
    phase_t0: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    failure: str = ""
    n_masked: int = 0
    total: ClientUpdate | None = None
    cpu_s: float = 0.0  # the coordinator's own secure-aggregation work this round (validation, routing, unmask)

    @classmethod
    def from_round(cls, rs: RoundState, **kw: Any) -> SecAggRound:
        base = {f.name: getattr(rs, f.name) for f in fields(RoundState)}
        out = cls(**base, **kw)
        out.deadline_s = out.collect_s + 2 * out.phase_s
        out.phase_t0 = out.started
        out.n_masked = sum(v.numel() for k, v in rs.rules.global_state.items() if v.is_floating_point()) + 2
        return out

    # ------------------------------------------------------------------ helpers
    @property
    def topics(self) -> Topics:
        return Topics(self.federation)

    def _idx(self) -> dict[str, int]:
        if len(self.rank) != len(self.roster):
            self.rank = {c: i + 1 for i, c in enumerate(self.roster)}
        return self.rank

    def _nbrs(self, cid: str) -> set[str]:
        return {self.roster[v - 1] for v in self.graph[self._idx()[cid]]}

    def _ranked(self, names) -> list[int]:
        """Roster indices of ``names``, ascending (the order of every compact secagg list and blob)."""
        idx = self._idx()
        return sorted(idx[c] for c in names)

    def _post(self, cid: str, msg: Any) -> None:
        payload = encode(msg)
        self.bytes_down += len(payload)
        if self.send is not None:
            self.send(self.topics.secagg_down(cid), payload)

    def _head(self) -> dict[str, Any]:
        return {"federation": self.federation, "sender": COORDINATOR_ID, "round": self.index, "task_id": self.task_id,
                "run_id": self.run_id}

    def _next(self, phase: str, now: float) -> None:
        self.timings[f"{self.phase}_s"] = round(now - self.phase_t0, 4)
        self.phase, self.phase_t0 = phase, now
        logger.info("round %d secagg: phase %s", self.index, phase)

    def _fail(self, why: str, now: float) -> None:
        self.failure = why
        self._next("done", now)
        logger.warning("round %d: secure aggregation failed: %s", self.index, why)

    # ------------------------------------------------------------------ messages in
    def offer(self, msg, tensors, nbytes, seen, bodies=None):  # type: ignore[override]
        raise Rejected("secagg_required", "this federation uses secure aggregation: plain updates are refused")

    def offer_secagg(self, msg: Any, tensors: dict[str, Tensor] | None, nbytes: int, seen: SeenIds) -> None:
        """Validate one client secure-aggregation message and keep it; raises :class:`Rejected` otherwise."""
        cid = msg.sender
        if msg.msg_id in seen:
            raise Rejected("replay", f"message id {msg.msg_id} was already received")
        seen.add(msg.msg_id)
        if msg.round != self.index:
            raise Rejected("late" if msg.round < self.index else "future_round",
                           f"{msg.kind} for round {msg.round} during round {self.index}")
        if msg.task_id != self.task_id:
            raise Rejected("wrong_task", f"task id {msg.task_id} is not this round's {self.task_id}")
        if cid not in self.selected:
            raise Rejected("not_selected", f"{cid} was not selected for round {self.index}")
        want = {"sa_keys": "keys", "sa_shares": "shares", "sa_masked": "masked", "sa_reveal": "unmask"}[msg.kind]
        if self.phase != want:
            raise Rejected("secagg_phase", f"{msg.kind} during the {self.phase} phase")
        t0 = time.perf_counter()
        try:
            getattr(self, f"_on_{msg.kind}")(msg, tensors)
        except SecAggError as exc:
            raise Rejected("bad_secagg", str(exc)) from None
        finally:
            self.cpu_s += time.perf_counter() - t0
        self.bytes_up += nbytes

    def _on_sa_keys(self, msg: Any, tensors: Any) -> None:
        if msg.sender in self.keys:
            raise Rejected("duplicate", f"{msg.sender} already advertised keys this round")
        pair = (unb64(msg.channel_pk, KEY_LEN, "channel_pk"), unb64(msg.mask_pk, KEY_LEN, "mask_pk"))
        if pair[0] == pair[1] or set(pair) & {k for p in self.keys.values() for k in p}:
            raise SecAggError("a public key is reused (its own pair, or another client's)")
        self.keys[msg.sender] = pair

    def _on_sa_shares(self, msg: Any, tensors: Any) -> None:
        cid = msg.sender
        if cid not in self.roster:
            raise Rejected("not_selected", f"{cid} is not in this round's roster")
        if cid in self.sealed:
            raise Rejected("duplicate", f"{cid} already sent its shares")
        to = sorted(self.graph[self._idx()[cid]])
        self.sealed[cid] = dict(zip(to, unb64_records(msg.shares, SEALED_LEN, len(to), "the sealed shares")))

    def _on_sa_masked(self, msg: Any, tensors: dict[str, Tensor] | None) -> None:
        cid = msg.sender
        if cid not in self.sharers:
            raise Rejected("not_selected", f"{cid} got no inbox this round")
        if cid in self.masked:
            raise Rejected("duplicate", f"{cid} already sent its masked input")
        v = (tensors or {}).get("masked")
        if set(tensors or {}) != {"masked"} or v is None or v.dtype != torch.int32 or tuple(v.shape) != (self.n_masked,):
            raise SecAggError(f"the body must be one int32 tensor 'masked' of {self.n_masked} values")
        self.masked[cid] = v.numpy().view(np.uint32).copy()
        self.arrival[cid] = time.monotonic()

    def _on_sa_reveal(self, msg: Any, tensors: Any) -> None:
        cid = msg.sender
        if cid not in self.asked:
            raise Rejected("not_selected", f"{cid} was not asked to unmask")
        if cid in self.reveals:
            raise Rejected("duplicate", f"{cid} already revealed its shares")
        idx = self._idx()
        me = idx[cid]
        got = []
        for names, text, n, what in zip(self.asked[cid], (msg.b_shares, msg.key_shares), (B_SHARE_LEN, KEY_SHARE_LEN),
                                        ("self-mask", "key")):
            senders = self._ranked(names)
            raw = unb64_records(text, n, len(senders), f"the revealed {what} shares")
            for u, share in zip(senders, raw):
                # the holder's Shamir x-coordinate is its rank among the sender's neighbours
                if share[0] != sorted(self.graph[u]).index(me) + 1:
                    raise SecAggError(f"the {what} share of client {u} has index {share[0]}, not this holder's")
            got.append({self.roster[u - 1]: share for u, share in zip(senders, raw)})
        self.reveals[cid] = (got[0], got[1])

    # ------------------------------------------------------------------ phases
    def complete(self, min_updates: int, now: float | None = None) -> bool:  # type: ignore[override]
        now = time.monotonic() if now is None else now
        t0, phase = time.perf_counter(), self.phase
        try:
            return self._advance(now)
        finally:
            if self.phase != phase:
                self.cpu_s += time.perf_counter() - t0

    def _advance(self, now: float) -> bool:
        def live(ids, done) -> list[str]:  # still expected: not delivered, not offline, not cut off (flooding)
            return [c for c in ids if c not in done and c not in self.offline and c not in self.cut_off]

        if self.phase == "keys":
            if not live(self.selected, self.keys) or now >= self.started + min(self.phase_s, self.collect_s):
                self._close_keys(now)
        elif self.phase == "shares":
            if not live(self.roster, self.sealed) or now >= self.started + self.collect_s:
                self._close_shares(now)
        elif self.phase == "masked":
            if not live(self.sharers, self.masked) or now >= max(self.started + self.collect_s,
                                                                 self.phase_t0 + self.phase_s):
                self._close_masked(now)
        elif self.phase == "unmask" and (not live(self.asked, self.reveals) or now >= self.phase_t0 + self.phase_s):
            self._close_unmask(now)
        return self.phase == "done"

    def _close_keys(self, now: float) -> None:
        self.roster = sorted(self.keys)
        if len(self.roster) < 2:
            return self._fail(f"{len(self.roster)} client(s) advertised keys, secure aggregation needs 2", now)
        self.k, self.t = graph_params(len(self.roster), self.spec.neighbours, self.spec.threshold)
        self.graph = neighbour_graph(len(self.roster), self.k, self.graph_seed)
        self._next("shares", now)
        idx = self._idx()
        for c in self.roster:
            keys = b"".join(b"".join(self.keys[self.roster[v - 1]]) for v in sorted(self.graph[idx[c]]))
            self._post(c, SaRosterMsg(**self._head(), size=len(self.roster), index=idx[c], graph_seed=self.graph_seed,
                                      neighbours=self.k, threshold=self.t, keys=b64(keys)))

    def _close_shares(self, now: float) -> None:
        u1 = set(self.sealed)
        while True:  # a member with fewer than t sharing neighbours could not be recovered if it dropped
            thin = {c for c in u1 if len(self._nbrs(c) & u1) < self.t}
            if not thin:
                break
            u1 -= thin
        if len(u1) < 2:
            return self._fail(f"only {len(u1)} client(s) shared with at least t = {self.t} neighbours", now)
        self.sharers = u1
        self._next("masked", now)
        idx = self._idx()
        for c in sorted(u1):
            senders = self._ranked(self._nbrs(c) & u1)
            self._post(c, SaInboxMsg(**self._head(), senders=senders,
                                     shares=b64(b"".join(self.sealed[self.roster[s - 1]][idx[c]] for s in senders))))

    def _close_masked(self, now: float) -> None:
        u2 = set(self.masked)
        if len(u2) < 2:
            return self._fail(f"only {len(u2)} masked input(s) arrived", now)
        self._next("unmask", now)
        for c in sorted(u2):
            nb = self._nbrs(c) & self.sharers
            surv, drop = frozenset(nb & u2), frozenset(nb - u2)
            self.asked[c] = (surv, drop)
            self._post(c, SaUnmaskMsg(**self._head(), survivors=self._ranked(surv), dropped=self._ranked(drop)))

    def _close_unmask(self, now: float) -> None:
        idx = self._idx()
        revealed: dict[int, list[Shares]] = {}
        for cid, (b_shares, key_shares) in self.reveals.items():
            lst = [Shares(idx[u], idx[cid], (raw[0], raw[1:]), (0, b"")) for u, raw in b_shares.items()]
            lst += [Shares(idx[u], idx[cid], (0, b""), (raw[0], raw[1:])) for u, raw in key_shares.items()]
            revealed[idx[cid]] = lst
        masked = {idx[c]: v for c, v in self.masked.items()}
        pks = {idx[c]: self.keys[c][1] for c in self.sharers}
        try:
            total = unmask(masked, pks, revealed, self.t, bytes.fromhex(self.task_id), self.graph)
            delta, loss, w = decode_update_sum(total, self.spec.bound)
        except SecAggError as exc:
            return self._fail(str(exc), now)
        # sum n_k <= n_ref for honest clients, up to half a fixed-point quantum of rounding per client
        # (trainer/fl/secagg.py max_weight_sum: the proof): a larger weight means a lie or a garbled input
        if w > max_weight_sum(len(masked), self.spec.bound):
            return self._fail(f"the unmasked weight sum {w:.9f} exceeds 1 by more than the rounding of "
                              f"{len(masked)} clients (n_samples or masked inputs inconsistent)", now)
        g = self.rules.global_state
        state, off = dict(g), 0
        for k in masked_keys(g):
            n = g[k].numel()
            state[k] = (g[k].double() + torch.from_numpy(delta[off:off + n]).reshape(g[k].shape)).to(g[k].dtype)
            off += n
        n_total = max(1, round(w * self.spec.n_ref))
        self.total = ClientUpdate(state, n_total, {}, {"loss": loss})
        self.updates = {c: ClientUpdate({}, 1, {}, {"loss": loss}) for c in sorted(self.masked)}
        self._next("done", now)
        logger.info("round %d secagg: sum of %d masked updates unmasked (%d dropped after sharing, k=%d, t=%d)",
                    self.index, len(self.masked), len(self.sharers) - len(self.masked), self.k, self.t)

    # ------------------------------------------------------------------ result
    def aggregate(self):  # type: ignore[override]
        """The new server state: the unmasked sum enters the round's aggregator as one update."""
        if self.aggregator is None or self.total is None:
            raise ValueError("secure aggregation round has no result")
        self.aggregator.add(self.total)
        return self.aggregator.result()

    def report(self) -> dict[str, Any]:
        return {"roster": len(self.roster), "shared": len(self.sharers), "masked": len(self.masked),
                "revealed": len(self.reveals), "k": self.k, "t": self.t, "phases_s": dict(self.timings),
                "coordinator_cpu_s": round(self.cpu_s, 4),
                "failure": self.failure or None}
