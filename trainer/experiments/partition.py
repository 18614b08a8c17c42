"""Client partitions of the training subjects: one client per subject, or label-skewed splits within subjects.

A real fleet is heterogeneous in two ways: across users (subject shift, the ``subject`` split) and
in what each user records (label skew: one device holds mostly left-hand trials, another mostly
right). The label-skew splits cut each *training* subject's trials into several clients; held-out
subjects are never partitioned (they are evaluated whole). Every function here is pure and seeded.

Specs (``neurofed simulate --partition``):

* ``subject`` — one client per subject (the default; ids ``S001`` ...).
* ``dirichlet:BETA[:K]`` — each subject's trials go to ``K`` clients (default 2); for every class
  the shares of the ``K`` clients are drawn from Dirichlet(BETA·1_K) (Hsu et al. 2019, as in FedBM
  with BETA 0.05/0.1) and the class's shuffled trials are cut at those shares. Draws are repeated
  (same generator, so still seeded) until every client holds at least ``min_trials`` trials.
* ``missing-class`` — each subject's trials go to ``C`` clients (one per class); client ``k`` holds
  no trial of class ``k``; the trials of class ``c`` are dealt round-robin (shuffled) to the
  ``C - 1`` other clients. With two classes each client holds one class only.

Client ids are ``<subject>.p<k>``; every trial of a training subject is assigned exactly once.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import numpy as np

from neurofed.trainer.data.dataset import SubjectData

#: draws of a Dirichlet split before giving up on the minimum client size
MAX_DRAWS = 1000


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed ``--partition`` value.

    Attributes
    ----------
    kind : {"subject", "dirichlet", "missing-class"}
    beta : float
        Dirichlet concentration (``dirichlet`` only).
    parts : int
        Clients per subject (``dirichlet`` only; ``missing-class`` uses one per class).
    min_trials : int
        Smallest client a Dirichlet draw may produce (a BN mini-batch needs 2).
    """

    kind: str = "subject"
    beta: float = 0.0
    parts: int = 1
    min_trials: int = 2

    def __str__(self) -> str:
        if self.kind == "dirichlet":
            return f"dirichlet:{self.beta:g}:{self.parts}"
        return self.kind


def parse_partition(spec: str) -> PartitionSpec:
    """Parse ``subject``, ``dirichlet:BETA[:K]`` or ``missing-class``.

    Raises
    ------
    ValueError
        Unknown kind, BETA <= 0 or K < 2 (the message names the problem).
    """
    s = spec.strip().lower()
    if s == "subject":
        return PartitionSpec()
    if s == "missing-class":
        return PartitionSpec("missing-class")
    if s.startswith("dirichlet:"):
        fields = s.split(":")[1:]
        try:
            beta = float(fields[0])
            parts = int(fields[1]) if len(fields) > 1 else 2
        except (ValueError, IndexError):
            raise ValueError(f"partition {spec!r}: use dirichlet:BETA or dirichlet:BETA:K") from None
        if len(fields) > 2 or not beta > 0 or parts < 2:
            raise ValueError(f"partition {spec!r}: need BETA > 0 and K >= 2 clients per subject")
        return PartitionSpec("dirichlet", beta, parts)
    raise ValueError(f"unknown partition {spec!r}: use subject, dirichlet:BETA[:K] or missing-class")


def _subject_rng(seed: int, subject: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(subject.encode())])


def dirichlet_assignment(y: np.ndarray, n_classes: int, beta: float, parts: int, rng: np.random.Generator,
                         min_trials: int = 2) -> np.ndarray:
    """Client index (0..parts-1) of every trial: per class, shares ~ Dirichlet(beta·1).

    Raises
    ------
    ValueError
        No draw in :data:`MAX_DRAWS` gives every client ``min_trials`` trials (too few trials).
    """
    if len(y) < parts * min_trials:
        raise ValueError(f"{len(y)} trials cannot give {parts} clients {min_trials} trials each")
    for _ in range(MAX_DRAWS):
        owner = np.empty(len(y), dtype=np.int64)
        for c in range(n_classes):
            idx = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(parts, beta))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                owner[chunk] = k
        if np.bincount(owner, minlength=parts).min() >= min_trials:
            return owner
    raise ValueError(f"no Dirichlet({beta:g}) draw in {MAX_DRAWS} gives {parts} clients >= {min_trials} trials")


def missing_class_assignment(y: np.ndarray, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Client index of every trial: client ``k`` never holds class ``k``; other clients share class ``c``."""
    if n_classes < 2:
        raise ValueError("a missing-class split needs at least 2 classes")
    owner = np.empty(len(y), dtype=np.int64)
    for c in range(n_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        others = [k for k in range(n_classes) if k != c]
        owner[idx] = np.array(others)[np.arange(len(idx)) % len(others)]
    return owner


def partition_clients(train: list[SubjectData], spec: PartitionSpec | str, seed: int) -> dict[str, SubjectData]:
    """Clients of a training set under ``spec`` (held-out subjects never pass through here).

    Parameters
    ----------
    train : list of SubjectData
        Training subjects.
    spec : PartitionSpec or str
    seed : int
        Seed of the split (with the subject id: a subject splits the same way in every fold).

    Returns
    -------
    dict
        Client id -> its trials (a :class:`SubjectData` whose ``subject`` is the client id, trials in
        recording order).
    """
    if isinstance(spec, str):
        spec = parse_partition(spec)
    if spec.kind == "subject":
        return {sd.subject: sd for sd in train}
    out: dict[str, SubjectData] = {}
    for sd in train:
        rng = _subject_rng(seed, sd.subject)
        n_classes = len(sd.classes)
        if spec.kind == "dirichlet":
            owner = dirichlet_assignment(sd.y, n_classes, spec.beta, spec.parts, rng, spec.min_trials)
            parts = spec.parts
        else:
            owner = missing_class_assignment(sd.y, n_classes, rng)
            parts = n_classes
        for k in range(parts):
            idx = np.flatnonzero(owner == k)
            if len(idx) == 0:
                continue
            cid = f"{sd.subject}.p{k}"
            out[cid] = replace(sd, subject=cid, X=sd.X[idx], y=sd.y[idx])
    return out


def class_counts(clients: dict[str, SubjectData]) -> dict[str, list[int]]:
    """Trials per class of every client (results.json records the split)."""
    return {cid: np.bincount(sd.y, minlength=len(sd.classes)).astype(int).tolist() for cid, sd in clients.items()}
