"""Shared fixtures: the real EEGMMIDB data beside the repo, small preprocessed slices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from neurofed.trainer.data import PreprocessConfig, load_subjects, resolve_data_dir

torch.set_num_threads(1)
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    # the tests' own processes too (CLIs, the demo's children): with pytest-xdist on every core, a second
    # OpenMP thread per process only oversubscribes the cores (spinning threads slowed tests 10-50x)
    os.environ.setdefault(_var, "1")
if not os.environ.get("NEUROFED_CACHE"):
    # one fresh preprocessing cache per run, shared by pytest-xdist's workers (they inherit this environment
    # from the controller, which imports this file first); CI sets its own (.ci/run)
    import atexit
    import shutil
    import tempfile

    os.environ["NEUROFED_CACHE"] = tempfile.mkdtemp(prefix="neurofed-test-cache-")
    atexit.register(shutil.rmtree, os.environ["NEUROFED_CACHE"], True)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers get COLUMNS=80 / LINES from their parent: a rich Console created at import would be
    # fixed at 80 columns, where a plain run lets a test's CliRunner(env={"COLUMNS": ...}) decide
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (../shared/data or $NEUROFED_DATA)."""
    return resolve_data_dir(os.environ.get("NEUROFED_DATA"))


@pytest.fixture(scope="session")
def small_cfg() -> PreprocessConfig:
    """21 sensorimotor channels at 80 Hz, EA: the reduced protocol."""
    return PreprocessConfig.from_preset("sensorimotor21", resample=80.0)


@pytest.fixture(scope="session")
def subjects4(data_dir, small_cfg, tmp_path_factory):
    """Four real subjects, preprocessed (cached in a session temp folder)."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    return load_subjects([1, 2, 3, 4], small_cfg, data_dir)


@pytest.fixture(scope="session")
def release_models(tmp_path_factory, data_dir):
    """Two standalone exports of different real checkpoints (tests/release_support.py)."""
    from tests.release_support import two_standalone_models

    return two_standalone_models(tmp_path_factory, data_dir)


def _pip_wheel(src: Path, dest: Path, pattern: str) -> Path:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dest.glob(pattern)
    return wheel


@pytest.fixture(scope="session")
def neurofed_wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout (``pip wheel --no-deps``), built once per session (tests/shared_once.py)."""
    from tests.shared_once import build_once

    root = Path(__file__).resolve().parents[1]
    return build_once(tmp_path_factory, "wheel", lambda d: (_pip_wheel(root, d, "neurofed-*.whl"),))[0]


@pytest.fixture(scope="session")
def runtime_wheel(tmp_path_factory) -> Path:
    """The wheel of runtime/ (the ``neurofed-runtime`` distribution), built once per session."""
    from tests.shared_once import build_once

    root = Path(__file__).resolve().parents[1] / "runtime"
    return build_once(tmp_path_factory, "runtime-wheel", lambda d: (_pip_wheel(root, d, "neurofed_runtime-*.whl"),))[0]


@pytest.fixture(scope="session")
def release_keys(tmp_path_factory):
    """The federation's and a forger's Ed25519 key pairs (tests/release_support.py)."""
    from tests.release_support import key_pairs

    return key_pairs(tmp_path_factory)


@pytest.fixture(scope="session")
def cue_windows(data_dir):
    """Raw cue-locked windows of S003R04 (tests/release_support.py)."""
    from tests.release_support import cue_windows as windows

    return windows(data_dir)


# ---------------------------------------------------------------------------------------------- test tiers
# Every test is exactly one of unit / integration / e2e (tests/tiers.py says how a test gets its tier).

from tests import tier_guard  # noqa: E402
from tests.tiers import FILE_TIERS, LSL_FILES, LSL_SECOND_GROUP, SHARED_SETUP_FILES, TEST_TIERS, TIERS  # noqa: E402

_TIER_STASH = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, whatever is selected
def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parents[1]
    bad, tiers = [], {}
    for item in items:
        own = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if not own:
            rel = Path(item.fspath).resolve().relative_to(root).as_posix()
            tier = TEST_TIERS.get(f"{rel}::{item.originalname}", FILE_TIERS.get(rel))
            if tier is not None:
                own = [tier]
                item.add_marker(getattr(pytest.mark, own[0]))
        if len(own) != 1:
            bad.append(f"{item.nodeid}: {', '.join(own) or 'no tier'}")
        tiers[item.nodeid] = own
        if item.get_closest_marker("xdist_group") is None:  # under `-n ... --dist loadgroup` (tests/tiers.py)
            rel = Path(item.fspath).resolve().relative_to(root).as_posix()
            if own != ["unit"] and rel in LSL_FILES:  # one worker, one at a time
                item.add_marker(pytest.mark.xdist_group("lsl2" if rel in LSL_SECOND_GROUP else "lsl"))
            elif rel in SHARED_SETUP_FILES:  # one worker: its module-scoped set-up runs once
                item.add_marker(pytest.mark.xdist_group(SHARED_SETUP_FILES[rel]))
    config.stash[_TIER_STASH] = tiers
    if bad:
        raise pytest.UsageError("every test needs exactly one tier (unit, integration or e2e; tests/tiers.py):\n  "
                                + "\n  ".join(bad))


@pytest.fixture
def collected_tiers(request) -> dict[str, list[str]]:
    """nodeid -> tiers of every test this session collected (tests/test_tiers.py)."""
    return request.config.stash[_TIER_STASH]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Each test starts on one intra-op thread: an in-process `neurofed simulate` sets its `--threads` (default:
    every core) and would leave them to the tests after it, which then oversubscribe the cores under xdist."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _unit_tier_guard(request):
    """A unit test that starts a process, opens an internet socket or uses LSL fails, naming what it did."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    with tier_guard.watch() as hits:
        yield
    if hits:
        pytest.fail(f"{request.node.nodeid} is marked unit but " + "; ".join(dict.fromkeys(hits))
                    + " (mark it integration: tests/tiers.py)", pytrace=False)
