"""Label-skew partitions: seeded, every trial once, class counts as specified."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.experiments.partition import (
    class_counts,
    dirichlet_assignment,
    parse_partition,
    partition_clients,
)


def _subject(name: str, n: int = 45, n_classes: int = 2, seed: int = 0) -> SubjectData:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n).astype(np.int64)
    X = np.arange(n, dtype=np.float32)[:, None, None] * np.ones((1, 3, 40), np.float32)  # trial id in X
    return SubjectData(name, X, y, tuple(f"c{k}" for k in range(n_classes)), 80.0, ["C3", "Cz", "C4"])


SUBJECTS = [_subject("S001", seed=1), _subject("S002", seed=2), _subject("S003", n=30, seed=3)]


def _assigned_once(clients: dict[str, SubjectData]) -> None:
    for sd in SUBJECTS:
        got = np.sort(np.concatenate([c.X[:, 0, 0] for cid, c in clients.items() if cid.startswith(sd.subject)]))
        np.testing.assert_array_equal(got, np.arange(sd.n_trials, dtype=np.float32))
        pooled = np.concatenate([c.y for cid, c in clients.items() if cid.startswith(sd.subject)])
        assert np.bincount(pooled, minlength=2).tolist() == np.bincount(sd.y, minlength=2).tolist()


def test_parse_partition_specs_and_errors():
    assert parse_partition("subject").kind == "subject"
    d = parse_partition("dirichlet:0.05")
    assert (d.kind, d.beta, d.parts) == ("dirichlet", 0.05, 2)
    assert parse_partition("dirichlet:0.5:3").parts == 3
    assert parse_partition("missing-class").kind == "missing-class"
    for bad in ("dirichlet:0", "dirichlet:x", "dirichlet:0.1:1", "shards", "dirichlet:0.1:2:3"):
        with pytest.raises(ValueError, match="partition"):
            parse_partition(bad)


def test_subject_partition_is_identity():
    clients = partition_clients(SUBJECTS, "subject", seed=0)
    assert list(clients) == ["S001", "S002", "S003"]
    assert clients["S001"] is SUBJECTS[0]


@pytest.mark.parametrize("spec", ["dirichlet:0.05", "dirichlet:0.1", "dirichlet:0.5:3", "missing-class"])
def test_every_trial_assigned_once_and_seeded(spec):
    a = partition_clients(SUBJECTS, spec, seed=7)
    b = partition_clients(SUBJECTS, spec, seed=7)
    _assigned_once(a)
    assert class_counts(a) == class_counts(b)
    for cid in a:
        np.testing.assert_array_equal(a[cid].X, b[cid].X)
        assert a[cid].subject == cid and cid.split(".p")[0] in {"S001", "S002", "S003"}
    if spec == "missing-class":  # two classes: the split is fixed (each client holds the other class)
        return
    c = partition_clients(SUBJECTS, spec, seed=8)
    assert any(not np.array_equal(a[k].X, c[k].X) for k in a if k in c) or a.keys() != c.keys()


def test_missing_class_clients_lack_their_class():
    clients = partition_clients(SUBJECTS, "missing-class", seed=0)
    for cid, counts in class_counts(clients).items():
        k = int(cid.split(".p")[1])
        assert counts[k] == 0 and sum(counts) > 0  # two classes: client k holds only the other class


def test_dirichlet_skew_grows_as_beta_shrinks():
    """Mean majority-class share of a client over 40 synthetic subjects (45 trials, 2 clients each):
    0.86 at beta 0.05, 0.84 at 0.1, 0.74 at 0.5 (seed 0; the minimum client size rejects the draws
    that would leave a client empty, which caps the skew)."""
    many = [_subject(f"S{i:03d}", n=45, seed=i) for i in range(1, 41)]

    def majority(beta: float) -> float:
        counts = class_counts(partition_clients(many, f"dirichlet:{beta}", seed=0))
        return float(np.mean([max(c) / sum(c) for c in counts.values()]))

    skew_005, skew_05 = majority(0.05), majority(0.5)
    assert skew_005 > 0.8 and skew_005 > skew_05 + 0.1 and skew_05 > 0.5


def test_dirichlet_assignment_minimum_size_and_error():
    y = np.array([0] * 10 + [1] * 10)
    owner = dirichlet_assignment(y, 2, 0.05, 2, np.random.default_rng(0), min_trials=3)
    assert np.bincount(owner, minlength=2).min() >= 3
    with pytest.raises(ValueError, match="cannot give"):
        dirichlet_assignment(y[:3], 2, 0.05, 2, np.random.default_rng(0))
