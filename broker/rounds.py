"""Book-keeping of one round: who was asked, what arrived, what was rejected, when it ends."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from torch import Tensor

from neurofed.broker.protocol import UpdateMsg
from neurofed.broker.validation import UpdateRules, check_update
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.server import RoundAggregator


class SeenIds:
    """Bounded memory of message ids or body hashes (replay protection across rounds), oldest forgotten first."""

    def __init__(self, limit: int = 200_000) -> None:
        self._ids: OrderedDict[str, object] = OrderedDict()
        self.limit = limit

    def __contains__(self, mid: object) -> bool:
        return mid in self._ids

    def get(self, mid: str, default: object = None) -> object:
        return self._ids.get(mid, default)

    def add(self, mid: str, value: object = None) -> None:
        self._ids[mid] = value
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)


@dataclass
class RoundState:
    """One round in progress.

    The round is complete when every selected client delivered, or when every selected client
    that has not delivered is offline (and ``min_updates`` arrived), or at the deadline.
    """

    index: int
    task_id: str
    selected: list[str]
    rules: UpdateRules
    deadline_s: float
    started: float = field(default_factory=time.monotonic)
    updates: dict[str, ClientUpdate] = field(default_factory=dict)
    arrival: dict[str, float] = field(default_factory=dict)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    offline: set[str] = field(default_factory=set)
    cut_off: set[str] = field(default_factory=set)  # over their message / byte budget: not waited for (issue 54)
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_extras: dict[str, int] = field(default_factory=dict)  # strategy extras sent this round, per component
    aggregator: RoundAggregator | None = None  # the round's aggregation (neurofed.trainer.fl.server)
    stream: bool = False  # add each update to the aggregator on arrival and keep only its metrics

    @property
    def deadline(self) -> float:
        return self.started + self.deadline_s

    def offer(self, msg: UpdateMsg, tensors: dict[str, Tensor] | None, nbytes: int, seen: SeenIds,
              bodies: SeenIds | None = None) -> ClientUpdate:
        """Validate and keep an update; raises :class:`Rejected` otherwise (the caller records it with :meth:`reject`).

        ``bodies`` remembers the body hash of every accepted update (see :func:`check_update`).
        """
        try:
            upd = check_update(msg, tensors, self.rules, set(self.updates), seen, bodies)  # type: ignore[arg-type]
        finally:
            seen.add(msg.msg_id)
        if bodies is not None:
            bodies.add(msg.body_sha256, (self.index, msg.sender))
        if self.stream and self.aggregator is not None:
            self.aggregator.add(upd, msg.sender)
            upd = ClientUpdate({}, upd.n_samples, {}, upd.metrics)
        self.updates[msg.sender] = upd
        self.arrival[msg.sender] = time.monotonic()
        self.bytes_up += nbytes
        return upd

    def reject(self, sender: str, code: str, detail: str) -> None:
        self.rejected.append((sender, code, detail))

    def missing(self) -> list[str]:
        return [c for c in self.selected if c not in self.updates]

    def complete(self, min_updates: int, now: float | None = None) -> bool:
        """Asked after every incoming message: O(1) unless enough clients are offline or cut off to matter."""
        now = time.monotonic() if now is None else now
        if len(self.updates) >= len(self.selected) or now >= self.deadline:  # updates come only from the selected
            return True
        if len(self.updates) < min_updates or len(self.updates) + len(self.offline) + len(self.cut_off) < len(
                self.selected):  # too few offline / cut off for every missing client to be one of them
            return False
        return all(c in self.offline or c in self.cut_off for c in self.missing())

    def ordered(self) -> list[tuple[str, ClientUpdate]]:
        return sorted(self.updates.items())

    def aggregate(self):
        """The new server state: streamed updates are already in; otherwise add them in client-id order."""
        if self.aggregator is None:
            raise ValueError("round has no aggregator")
        if not self.stream:
            for cid, u in self.ordered():
                self.aggregator.add(u, cid)
        return self.aggregator.result()
