"""The coordinator's side of an asynchronous federation (``federation.mode = "async"``, docs/async.md).

The maths is :class:`neurofed.trainer.fl.fedbuff.BufferedServer` (the same object the simulation drives,
:mod:`neurofed.trainer.experiments.asyncsim`); this module keeps what the wire needs around it: per model version the
hash of the downlink a client trains from, the bytes its delta-coded update is coded against and the validation
rules, for the versions an update may still be based on (``max_staleness + 1``: bounded memory), and a log of every
submission of the current aggregation window (bounded by the per-client message budgets of that window).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from neurofed.broker.protocol import UpdateMsg, delta_reference, state_sha256
from neurofed.broker.registry import Registry
from neurofed.broker.rounds import SeenIds
from neurofed.broker.validation import Rejected, UpdateRules, check_update, tensor_specs
from neurofed.trainer.fl.api import Strategy
from neurofed.trainer.fl.fedbuff import ACCEPTED, BufferedServer, Verdict, async_clip_mult, async_value_keys
from neurofed.trainer.fl.server import ServerState, downlink

__all__ = ["AsyncRound", "TrialCounts"]


class TrialCounts:
    """``client -> trials it joined with`` read from the registry on each update (a client whose store grew joins
    again with its new count), without copying the registry per version."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def get(self, cid: str, default: int | None = None) -> int | None:
        info = self.registry.clients.get(cid)
        return default if info is None else info.n_trials


@dataclass
class AsyncRound:
    """The buffered server of a running asynchronous federation and what validating its updates needs.

    Parameters
    ----------
    server : ServerState
        The current state (``round`` = the model version).
    task_id : str
        The run's retained asynchronous task; every update names it.
    """

    server: ServerState
    strategy: Strategy
    model: Any
    task_id: str
    buffer_k: int
    max_staleness: int
    server_lr: float
    registry: Registry
    rules_kw: dict[str, Any] = field(default_factory=dict)
    buf: BufferedServer = field(init=False)
    #: version -> (validation rules, delta reference bytes), for the versions an update may be based on
    versions: dict[int, tuple[UpdateRules, bytes]] = field(default_factory=dict, init=False)
    #: submissions of the current window: [client, base version, code, staleness, weight, trials]
    log: list[list[Any]] = field(default_factory=list, init=False)
    losses: list[float] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        state = self.server.global_state
        self.buf = BufferedServer(self.server, self.buffer_k, self.max_staleness, self.server_lr,
                                  async_clip_mult(self.strategy),
                                  async_value_keys(state, downlink(state, self.strategy, self.model)))
        self._add_version()

    @property
    def version(self) -> int:
        return self.buf.version

    @property
    def global_state(self) -> dict[str, Tensor]:
        return self.buf.server.global_state

    def _add_version(self) -> None:
        state = self.buf.server.global_state
        rules = UpdateRules(
            round=self.version, task_id=self.task_id,
            base_sha256=state_sha256(downlink(state, self.strategy, self.model)), selected=frozenset(),
            state_specs=tensor_specs(state), extra_specs=self.strategy.upload_specs(self.model), global_state=state,
            n_trials=TrialCounts(self.registry), any_client=True, **self.rules_kw)  # type: ignore[arg-type]
        self.versions[self.version] = (rules, delta_reference(state))
        for old in [v for v in self.versions if v < self.version - self.max_staleness]:
            del self.versions[old]

    def reference(self, msg: UpdateMsg, seen: SeenIds) -> bytes:
        """The bytes an update based on ``msg.round`` is delta-coded against; refuses a replayed message id, an
        unknown task and a stale or future base (:meth:`BufferedServer.check`, counted there) before the body is
        decoded."""
        if msg.msg_id in seen:
            raise Rejected("replay", f"message id {msg.msg_id} was already received")
        if msg.task_id != self.task_id:
            raise Rejected("wrong_task", f"task id {msg.task_id} is not this run's asynchronous task {self.task_id}")
        if (v := self.buf.check(msg.round)) is not None:
            self.log.append([msg.sender, msg.round, v.code, v.staleness, 0.0, msg.n_samples])
            if v.code == "stale":
                raise Rejected("stale", f"update from version {msg.round} is {v.staleness} versions old (max "
                               f"{self.max_staleness}); fetch the current model (version {self.version})")
            raise Rejected("future", f"update from version {msg.round}, but the current version is {self.version}")
        return self.versions[msg.round][1]

    def offer(self, msg: UpdateMsg, tensors: dict[str, Tensor] | None, seen: SeenIds, bodies: SeenIds) -> Verdict:
        """Validate an update whose base :meth:`reference` accepted and submit it to the buffered server."""
        rules = self.versions[msg.round][0]
        try:
            first = bodies.get(msg.body_sha256)
            if first is not None:  # the same weights again (even from the same client: it would count twice)
                raise Rejected("replay", f"identical update body was already accepted ({first})")
            upd = check_update(msg, tensors, rules, set(), seen)  # type: ignore[arg-type]
        finally:
            seen.add(msg.msg_id)
        bodies.add(msg.body_sha256, (msg.round, msg.sender))
        v = self.buf.submit(msg.sender, upd, msg.round)
        self.log.append([msg.sender, msg.round, v.code, v.staleness, v.weight, upd.n_samples])
        if v.code == ACCEPTED and "loss" in upd.metrics:
            self.losses.append(float(upd.metrics["loss"]))
        if v.aggregated:
            self._add_version()
        return v

    def window(self) -> dict[str, Any]:
        """The record of the window that just closed (an aggregation): its submissions, then a fresh window."""
        acc = [row for row in self.log if row[2] == ACCEPTED]
        rec = {"version": self.version, "submissions": self.log, "used": len(acc),
               "mean_staleness": sum(r[3] for r in acc) / len(acc) if acc else None,
               "loss": sum(self.losses) / len(self.losses) if self.losses else None,
               "clipped_total": self.buf.clipped, "rejected_total": dict(self.buf.rejected)}
        self.log, self.losses = [], []
        return rec
