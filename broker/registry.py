"""Registry of the clients that joined a federation: trial counts, capabilities, presence, history."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from neurofed.broker.protocol import JoinMsg


@dataclass
class ClientInfo:
    """What the coordinator knows about one client (never its data)."""

    client_id: str
    n_trials: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    joined_at: float = 0.0
    last_seen: float = 0.0
    online: bool = True
    rounds_done: int = 0
    rejected: int = 0
    profile: str = ""  # device profile (hierarchical federations)


class Registry:
    """Joined clients by id. ``candidates()`` (sorted online ids) feeds client selection."""

    def __init__(self) -> None:
        self.clients: dict[str, ClientInfo] = {}
        self._online: set[str] = set()  # ids with ``online`` set: counted per incoming message while joining
        self._online_training: set[str] = set()  # ... of them, those that train (not joined with ``evaluate``)

    def n_online(self) -> int:
        """How many clients are online, in O(1) (the coordinator asks after every message while clients join)."""
        return len(self._online)

    def n_training_online(self) -> int:
        """How many online clients train (``min_clients`` counts these: a validating client, joined with the
        ``evaluate`` capability, never trains), in O(1)."""
        return len(self._online_training)

    @staticmethod
    def trains(info: ClientInfo) -> bool:
        """A client trains unless it joined to validate (``edge-client join --evaluate``)."""
        return not info.capabilities.get("evaluate")

    def _mark(self, info: ClientInfo) -> None:
        for group, member in ((self._online, info.online), (self._online_training, info.online and self.trains(info))):
            (group.add if member else group.discard)(info.client_id)

    def __len__(self) -> int:
        return len(self.clients)

    def __contains__(self, cid: object) -> bool:
        return cid in self.clients

    def join(self, msg: JoinMsg) -> ClientInfo:
        """Add or refresh a client (a rejoin after a reconnect keeps its history)."""
        now = time.time()
        info = self.clients.get(msg.sender)
        if info is None:
            info = self.clients[msg.sender] = ClientInfo(msg.sender, msg.n_trials, dict(msg.capabilities), now, now)
        info.n_trials, info.capabilities, info.profile = msg.n_trials, dict(msg.capabilities), msg.profile
        info.online, info.last_seen = True, now
        self._mark(info)
        return info

    def set_online(self, cid: str, online: bool) -> None:
        info = self.clients.get(cid)
        if info is not None:
            info.online, info.last_seen = online, time.time()
            self._mark(info)

    def profiles(self) -> dict[str, str]:
        """Client id -> device profile, of every client that joined with one."""
        return {c: i.profile for c, i in self.clients.items() if i.profile}

    def candidates(self) -> list[str]:
        return sorted(self._online)

    def ids(self) -> list[str]:
        return sorted(self.clients)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(self.clients[c]) for c in self.ids()]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]]) -> Registry:
        reg = cls()
        for row in rows:
            info = ClientInfo(**row)
            info.online = False  # presence is re-learned from retained status messages
            reg.clients[info.client_id] = info
        return reg
