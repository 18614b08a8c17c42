"""``neurofed bench secagg``'s per-round attribution of the swarm's counters (the swarm runs in its own process)."""

from __future__ import annotations

from neurofed.bench_secagg import _swarm_rounds


def test_swarm_counters_split_at_each_rounds_first_task() -> None:
    marks = [("task", 0, 0.0, 100), ("task", 1, 0.5, 400),
             ("task", 1, 0.7, 450),  # the coordinator re-issued round 1: still round 1
             ("result", 2, 1.5, 1000)]
    got = _swarm_rounds(marks)
    assert got == {0: (0.5, 300), 1: (1.0, 600)}


def test_a_round_with_no_end_mark_is_left_out() -> None:
    assert _swarm_rounds([("task", 0, 0.0, 10)]) == {}
