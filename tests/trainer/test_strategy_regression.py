"""Every algorithm's 2-round result on real data is bit-identical to the pre-refactor code (issue 15).

The reference is the flag-based code itself: commit :data:`REF_COMMIT` (the last commit before the strategy
objects), taken from this repository's history with ``git archive`` and run on this machine; the strategy objects
must reproduce its hashes exactly (same seeds, same order of floating-point operations).

Why not a stored list of hashes alone: bit-identical results also need the same CPU kernels, and pinning them
is not enough across machines. oneDNN (convolutions), ATen and OpenBLAS pick kernels from the CPU's instruction
set and can be pinned (:data:`PINNED_ENV`), but torch's BLAS is MKL, whose code paths differ between CPU vendors:
measured 2026-11-24, the fixture recorded under the pin on an Intel machine failed all 12 cases on an AMD EPYC
(AVX-512) machine, where the reference commit and the current code agreed on all 12. So both sides are computed
here, each in a child process with the kernels pinned and an empty preprocessing cache (cached epochs carry the
kernels that made them); ~10 s each. ``tests/fixtures/strategy_hashes.json`` (recorded with the pin on the
reference commit, Intel) is the fallback when the repository has no history (a shallow clone, an sdist): then a
mismatch can also mean other kernels, and the failure message says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from neurofed.trainer.experiments.runner import run_centralised, run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import CLIPPED_KEY
from neurofed.trainer.fl.strategies import get_strategy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "strategy_hashes.json"
ROOT = Path(__file__).resolve().parents[2]
#: the flag-based code before the strategy refactor (its own copy of this test records the hashes)
REF_COMMIT = "069bb9cd8709ea3dda60515a8547f7632f94348e"
CFG = LocalConfig(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=8, local_epochs=1)
#: the CPU kernels the reference was recorded with (read by oneDNN, ATen and OpenBLAS at start-up)
PINNED_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
#: name -> (algorithm, overrides); ablations and the stale-BN option too
CASES: dict[str, tuple[str, dict]] = {
    "ct": ("ct", {}),
    "fedavg": ("fedavg", {}),
    "fedprox": ("fedprox", {}),
    "fedprox_mu1": ("fedprox", {"prox_mu": 1.0}),
    "scaffold": ("scaffold", {}),
    "moon": ("moon", {}),
    "fedbn": ("fedbn", {}),
    "fedbs": ("fedbs", {}),
    "fedbs_stale": ("fedbs", {"bn_sync": "stale_global"}),
    "fedbs_nosam": ("fedbs", {"sam_rho": 0.0}),
    "safe": ("safe", {}),
    "safe_sam": ("safe", {"sam_rho": 0.1}),
}


def state_hash(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def run_case(name: str, subjects) -> str:
    torch.set_num_threads(1)
    alg, over = CASES[name]
    st = get_strategy(alg, **over)
    if alg == "ct":
        model, _ = run_centralised(subjects, "eegnet", st, CFG, 2, 3)
        return state_hash(model.state_dict())
    clients = {sd.subject: sd for sd in subjects}
    model, info = run_federated(clients, "eegnet", st, CFG, 2, 0.75, 3)
    # the clip count (added after the reference commit) is bookkeeping, not training state: left out of the hash
    extras = {k: v for k, v in info["server"].extras.items() if k != CLIPPED_KEY}
    extra = state_hash(extras) if extras else ""
    return state_hash(model.state_dict()) + (":" + extra if extra else "")


def all_hashes() -> dict[str, str]:
    """Every case's hash in this process (run it with :data:`PINNED_ENV` set before Python starts)."""
    from neurofed.trainer.data import PreprocessConfig, load_subjects, resolve_data_dir

    subs = load_subjects([1, 2, 3, 4], PreprocessConfig.from_preset("sensorimotor21", resample=80.0),
                         resolve_data_dir(os.environ.get("NEUROFED_DATA")))
    return {n: run_case(n, subs) for n in CASES}


def _has_avx2() -> bool:
    try:
        return "avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _pinned_env(data_dir: Path, cache: Path, code: Path) -> dict[str, str]:
    return {**os.environ, **PINNED_ENV, "NEUROFED_DATA": str(data_dir), "NEUROFED_CACHE": str(cache),
            "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}


def _reference_tree(dest: Path) -> Path | None:
    """:data:`REF_COMMIT`'s files under ``dest`` (``git archive``), or None without git or that history."""
    git = shutil.which("git")
    if git is None or subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{REF_COMMIT}^{{commit}}"],
                                     capture_output=True, check=False).returncode != 0:
        return None
    tar = subprocess.run([git, "-C", str(ROOT), "archive", "--format=tar", REF_COMMIT], capture_output=True,
                         check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def pinned_hashes(data_dir, tmp_path_factory) -> dict[str, str]:
    """This code's hashes (child process, pinned kernels, empty cache)."""
    if not _has_avx2():
        pytest.skip("the pinned kernels are AVX2; this CPU has no AVX2")
    env = _pinned_env(data_dir, tmp_path_factory.mktemp("regression_cache"), ROOT)
    proc = subprocess.run([sys.executable, "-m", "tests.trainer.test_strategy_regression", "--print"],
                          check=False, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, f"the pinned-kernel child process failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference_hashes(data_dir, tmp_path_factory) -> tuple[dict[str, str], str]:
    """The reference commit's hashes on this machine (its own test module records them in its own tree), or the
    stored fixture when the history is not here; with a word on where they came from."""
    tree = _reference_tree(tmp_path_factory.mktemp("reference_code"))
    if tree is None:
        return json.loads(FIXTURE.read_text()), (f"stored fixture (no git history with {REF_COMMIT[:7]} here: "
                                                 "recorded on other CPU kernels, a mismatch may be the machine's)")
    env = _pinned_env(data_dir, tmp_path_factory.mktemp("reference_cache"), tree)
    proc = subprocess.run([sys.executable, "-m", "tests.trainer.test_strategy_regression"], check=False, env=env,
                          capture_output=True, text=True, timeout=900, cwd=tree)
    assert proc.returncode == 0, f"the reference code ({REF_COMMIT[:7]}) failed to run:\n{proc.stderr[-3000:]}"
    return json.loads((tree / "tests" / "fixtures" / "strategy_hashes.json").read_text()), \
        f"commit {REF_COMMIT[:7]} run on this machine"


@pytest.mark.parametrize("name", list(CASES))
def test_two_rounds_bit_identical_to_reference(name, pinned_hashes, reference_hashes):
    want, source = reference_hashes
    assert pinned_hashes[name] == want[name], f"{name}: differs from the reference ({source})"


if __name__ == "__main__":  # --print: JSON of every hash on stdout; --record: (re)write the fixture
    missing = {k: v for k, v in PINNED_ENV.items() if os.environ.get(k) != v}
    if missing:  # (and NEUROFED_CACHE an empty folder: cached epochs carry the kernels that made them)
        sys.exit(f"set the pinned kernels first: {' '.join(f'{k}={v}' for k, v in PINNED_ENV.items())}")
    hashes = all_hashes()
    if "--record" in sys.argv:  # only ever on the pre-refactor code (commit 069bb9c)
        FIXTURE.write_text(json.dumps(hashes, indent=1) + "\n")
    print(json.dumps(hashes))
