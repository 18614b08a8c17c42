"""A client's side of one secure-aggregation round over MQTT (SecAgg+; the maths is :mod:`neurofed.trainer.fl.secagg`).

Messages in, messages out: the :class:`EdgeClient` (or a benchmark swarm) feeds every ``secagg_down/<id>``
message to :meth:`SecAggSession.step` and publishes what it returns on ``secagg/<id>``. The session
checks everything the coordinator tells it before acting on it (docs/protocol.md, "Secure aggregation"):

* the roster's graph parameters ``(k, t)`` are the ones the task's settings give for the roster size (the
  coordinator cannot lower the threshold); the neighbours are this client's in the seeded graph (derived here,
  not taken from the coordinator), the roster carries exactly one key pair per neighbour, no key repeated;
* its inbox holds sealed shares from neighbours only, each authenticated (ChaCha20-Poly1305), at least ``t``;
* the unmask request names only neighbours that shared, survivors and dropped disjoint, at least ``t``
  survivors; it is answered once per round, so no neighbour's self-mask and key shares both leave this client.

Fresh keys and seeds per round come from ``os.urandom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from neurofed.broker.protocol import (
    SaInboxMsg,
    SaKeysMsg,
    SaMaskedMsg,
    SaRevealMsg,
    SaRosterMsg,
    SaSharesMsg,
    SaUnmaskMsg,
    TaskMsg,
)
from neurofed.edge import logger
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.secagg import (
    KEY_LEN,
    SEALED_LEN,
    SecAggClient,
    SecAggError,
    Shares,
    b64,
    encode_update,
    graph_params,
    masked_keys,
    neighbours_of,
    unb64_records,
)

Out = tuple[Any, dict[str, Tensor] | None]


def share_aad(federation: str, task_id: str, sender: int, recipient: int) -> bytes:
    """What a sealed share is bound to: federation, round (task id), sender and recipient (roster indices)."""
    return f"neurofed-secagg|{federation}|{task_id}|{sender}|{recipient}".encode()


class SecAggSession:
    """One selected client in one secure-aggregation round.

    Parameters
    ----------
    federation, client_id : str
    task : TaskMsg
        The round's task (``task.secagg`` set).
    rng : numpy Generator, optional
        Only for reproducible tests; by default keys and seeds come from ``os.urandom``.
    """

    def __init__(self, federation: str, client_id: str, task: TaskMsg, rng: np.random.Generator | None = None) -> None:
        if task.secagg is None:
            raise SecAggError("not a secure aggregation task")
        self.fed, self.cid, self.task, self.spec = federation, client_id, task, task.secagg
        self.core = SecAggClient(0, bytes.fromhex(task.task_id), rng)
        self.index = 0  # this client's roster index (0: no roster yet)
        self.neighbours: list[int] = []  # their roster indices, ascending
        self.keys: dict[int, tuple[bytes, bytes]] = {}  # neighbour -> (channel_pk, mask_pk)
        self.t = 0
        self.inbox: dict[int, Shares] = {}
        self.vector: np.ndarray | None = None
        self.clamped = 0
        self.masked_sent = False
        self.revealed = False

    def _head(self) -> dict[str, Any]:
        return {"federation": self.fed, "sender": self.cid, "round": self.task.round, "task_id": self.task.task_id,
                "run_id": self.task.run_id}

    def keys_msg(self) -> SaKeysMsg:
        """Step 1: the two fresh public keys."""
        return SaKeysMsg(**self._head(), channel_pk=b64(self.core.channel_public_key()),
                         mask_pk=b64(self.core.public_key()))

    def set_update(self, upd: ClientUpdate, global_state: Mapping[str, Tensor]) -> list[Out]:
        """The trained update is ready: encode it (sent masked once the inbox is in)."""
        keys = masked_keys(global_state)
        delta = np.concatenate([(upd.state[k].double() - global_state[k].double()).flatten().numpy() for k in keys])
        if self.spec.norm_bound > 0:  # the clip moved to the client: the coordinator never sees single updates
            norm = float(np.linalg.norm(delta))
            if norm > self.spec.norm_bound:
                delta = delta * (self.spec.norm_bound / norm)
        self.vector, self.clamped = encode_update(delta, float(upd.metrics.get("loss", 0.0)), upd.n_samples,
                                                  self.spec.n_ref, self.spec.bound)
        if self.clamped:
            logger.warning("%s: %d update coordinates clamped to +-%g for secure aggregation", self.cid, self.clamped,
                           self.spec.bound)
        return self._maybe_masked()

    def step(self, msg: Any) -> list[Out]:
        """Handle one coordinator message of this round; returns what to publish. Bad input raises SecAggError."""
        if msg.round != self.task.round or msg.task_id != self.task.task_id:
            return []  # another round's message (a re-issued task starts a new session)
        if isinstance(msg, SaRosterMsg):
            return [(self._on_roster(msg), None)]
        if isinstance(msg, SaInboxMsg):
            self._on_inbox(msg)
            return self._maybe_masked()
        if isinstance(msg, SaUnmaskMsg):
            return [(self._on_unmask(msg), None)]
        raise SecAggError(f"unexpected {msg.kind} message from the coordinator")

    # ------------------------------------------------------------------ steps
    def _aad(self, sender: int, recipient: int) -> bytes:
        return share_aad(self.fed, self.task.task_id, sender, recipient)

    def _on_roster(self, msg: SaRosterMsg) -> SaSharesMsg:
        if self.index:
            raise SecAggError("a second roster for the same round")
        k, t = graph_params(msg.size, self.spec.neighbours, self.spec.threshold)
        if (msg.neighbours, msg.threshold) != (k, t):
            raise SecAggError(f"roster graph (k={msg.neighbours}, t={msg.threshold}) is not the task's (k={k}, t={t})")
        if not 1 <= msg.index <= msg.size:
            raise SecAggError(f"this client's roster index {msg.index} is not in 1..{msg.size}")
        nb = sorted(neighbours_of(msg.size, k, msg.graph_seed, msg.index))
        pairs = unb64_records(msg.keys, 2 * KEY_LEN, len(nb), "the roster's neighbour keys")
        if len({p[:KEY_LEN] for p in pairs} | {p[KEY_LEN:] for p in pairs}) != 2 * len(pairs):
            raise SecAggError("the roster repeats a public key")
        self.index, self.neighbours, self.t = msg.index, nb, t
        self.keys = {v: (p[:KEY_LEN], p[KEY_LEN:]) for v, p in zip(nb, pairs)}
        self.core.cid = msg.index
        sealed = [self.core.seal(s, self.keys[s.to][0], self._aad(msg.index, s.to)) for s in self.core.shares(nb, t)]
        return SaSharesMsg(**self._head(), shares=b64(b"".join(sealed)))  # in ascending neighbour index

    def _on_inbox(self, msg: SaInboxMsg) -> None:
        if not self.index or self.inbox:
            raise SecAggError("an inbox before the roster, or a second inbox")
        if not set(msg.senders) <= set(self.neighbours) or msg.senders != sorted(set(msg.senders)):
            raise SecAggError("the inbox names clients that are not this client's neighbours, or not in ascending order")
        if len(msg.senders) < self.t:
            raise SecAggError(f"only {len(msg.senders)} neighbours shared, the threshold is {self.t}")
        cts = unb64_records(msg.shares, SEALED_LEN, len(msg.senders), "the inbox's sealed shares")
        self.inbox = {v: self.core.open(v, ct, self.keys[v][0], self._aad(v, self.index))
                      for v, ct in zip(msg.senders, cts)}

    def _maybe_masked(self) -> list[Out]:
        if self.masked_sent or self.vector is None or not self.inbox:
            return []
        pks = {v: self.keys[v][1] for v in self.inbox}  # mask with the neighbours that shared
        y = self.core.masked_input(self.vector, pks)
        self.masked_sent = True
        return [(SaMaskedMsg(**self._head()), {"masked": torch.from_numpy(y.view(np.int32).copy())})]

    def _on_unmask(self, msg: SaUnmaskMsg) -> SaRevealMsg:
        if not self.masked_sent or self.revealed:
            raise SecAggError("an unmask request before this client sent its masked input, or a second one")
        surv, drop = set(msg.survivors), set(msg.dropped)
        if surv & drop or not (surv | drop) <= set(self.inbox) or msg.survivors != sorted(surv) \
                or msg.dropped != sorted(drop):
            raise SecAggError("the unmask request names a client twice, clients that did not share with this one, "
                              "or is not in ascending order")
        if len(surv) < self.t:
            raise SecAggError(f"only {len(surv)} surviving neighbours, the threshold is {self.t}: not revealing")
        self.revealed = True
        b = b"".join(bytes([self.inbox[v].b_share[0]]) + self.inbox[v].b_share[1] for v in msg.survivors)
        k = b"".join(bytes([self.inbox[v].key_share[0]]) + self.inbox[v].key_share[1] for v in msg.dropped)
        return SaRevealMsg(**self._head(), b_shares=b64(b), key_shares=b64(k))
