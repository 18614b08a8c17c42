"""Round book-keeping (broker/rounds.py) and the registry's presence count (broker/registry.py), issue 54: both
are asked after every incoming message, so they answer without scanning every client."""

from __future__ import annotations

from neurofed.broker.protocol import JoinMsg
from neurofed.broker.registry import Registry
from neurofed.broker.rounds import RoundState
from neurofed.trainer.fl.client import ClientUpdate


def _round(selected: list[str]) -> RoundState:
    return RoundState(0, "0" * 32, selected, rules=None, deadline_s=60.0, started=100.0)  # type: ignore[arg-type]


def test_round_completes_when_every_missing_client_is_offline_or_cut_off():
    rs = _round(["A", "B", "C", "D"])
    rs.updates = {"A": ClientUpdate({}, 1)}
    assert not rs.complete(1, now=101.0)
    rs.offline.add("X")  # not selected: does not count
    rs.offline.add("B")
    rs.cut_off.add("C")
    assert not rs.complete(1, now=101.0)  # D still expected
    rs.offline.add("D")
    assert rs.complete(1, now=101.0)
    assert not rs.complete(2, now=101.0)  # ... but min_updates is not met
    assert rs.complete(2, now=160.0)  # the deadline
    rs.updates.update({c: ClientUpdate({}, 1) for c in "BCD"})
    assert rs.complete(5, now=101.0)  # every selected client delivered


def test_registry_counts_online_clients_as_they_join_and_leave():
    reg = Registry()
    for c in ("B", "A", "C"):
        reg.join(JoinMsg(federation="f", sender=c, n_trials=45, n_channels=2, n_times=10, sfreq=80.0,
                         classes=["l", "r"]))
    assert reg.n_online() == 3 and reg.candidates() == ["A", "B", "C"]
    reg.set_online("B", False)
    reg.set_online("B", False)
    reg.set_online("Z", True)  # unknown: ignored
    assert reg.n_online() == 2 and reg.candidates() == ["A", "C"]
    back = Registry.from_json(reg.to_json())
    assert back.n_online() == 0 and back.candidates() == []  # presence is re-learned after a resume
    back.set_online("A", True)
    assert back.candidates() == ["A"]
