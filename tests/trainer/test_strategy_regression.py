"""Every algorithm's 2-round result on real data is bit-identical to the pre-refactor code (issue 15).

The reference hashes in ``tests/fixtures/strategy_hashes.json`` were recorded with the flag-based
strategies (commit 8e8bf6f) by ``python -m tests.trainer.test_strategy_regression``; the strategy
objects must reproduce them exactly (same seeds, same order of floating-point operations).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from trainer.experiments.runner import run_centralised, run_federated
from trainer.fl.local import LocalConfig
from trainer.fl.strategies import get_strategy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "strategy_hashes.json"
CFG = LocalConfig(lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=8, local_epochs=1)
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
    extra = state_hash(info["server"].extras) if info["server"].extras else ""
    return state_hash(model.state_dict()) + (":" + extra if extra else "")


@pytest.mark.parametrize("name", list(CASES))
def test_two_rounds_bit_identical_to_reference(name, subjects4):
    want = json.loads(FIXTURE.read_text())[name]
    assert run_case(name, subjects4) == want


if __name__ == "__main__":  # record the reference (only ever on the pre-refactor code)
    import os

    from trainer.data import PreprocessConfig, load_subjects, resolve_data_dir

    subs = load_subjects([1, 2, 3, 4], PreprocessConfig.from_preset("sensorimotor21", resample=80.0),
                         resolve_data_dir(os.environ.get("NEUROFED_DATA")))
    FIXTURE.write_text(json.dumps({n: run_case(n, subs) for n in CASES}, indent=1) + "\n")
    print(FIXTURE.read_text())
