"""Every collected test has exactly one tier, and the tier table names only test files that exist."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import tier_guard
from tests.tiers import FILE_TIERS, LSL_FILES, LSL_SECOND_GROUP, SHARED_SETUP_FILES, TEST_TIERS, TIERS

ROOT = Path(__file__).resolve().parents[1]


def test_every_collected_test_has_exactly_one_tier(collected_tiers):
    assert collected_tiers, "nothing collected?"
    bad = {n: t for n, t in collected_tiers.items() if len(t) != 1 or t[0] not in TIERS}
    assert not bad, bad


def test_the_tier_table_names_every_test_file_and_only_those():
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert set(FILE_TIERS) - files == set(), "tests/tiers.py names files that do not exist"
    assert LSL_FILES <= files and set(SHARED_SETUP_FILES) <= files and LSL_SECOND_GROUP <= LSL_FILES
    assert set(FILE_TIERS.values()) | set(TEST_TIERS.values()) <= set(TIERS)
    for node in TEST_TIERS:
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"tests/tiers.py: no {node}"


def test_the_unit_guard_sees_processes_and_sockets_but_not_unix_sockets():
    import socket

    with tier_guard.watch() as hits:
        a, b = socket.socketpair()  # AF_UNIX: allowed
        a.close(), b.close()
    assert hits == []
    with tier_guard.watch() as hits:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", 0))
        finally:
            s.close()
        with pytest.raises(FileNotFoundError):
            subprocess.Popen(["/nonexistent/neurofed-tier-guard"])
    assert any("internet socket" in h for h in hits) and any("started a process" in h for h in hits), hits


def test_the_test_command_counts_cores_before_it_pins_one_thread():
    """GNU nproc honours OMP_NUM_THREADS: read after `export OMP_NUM_THREADS=1` it said 1, and the suite ran on 2
    workers instead of cores + 1 (docs/BENCHMARKS.md "Test suite")."""
    lines = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    cores = next(i for i, line in enumerate(lines) if line.startswith("cores="))
    pin = next(i for i, line in enumerate(lines) if line.startswith("export OMP_NUM_THREADS=1"))
    assert cores < pin and "-u OMP_NUM_THREADS" in lines[cores], lines[cores]
    assert any(line.startswith("workers=") and "cores + 1" in line for line in lines[cores:pin])
