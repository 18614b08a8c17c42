"""``neurofed grid``: one task per (run, seed, fold), resumed from finished job JSONs, failures with tracebacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainer.errors import NeuroFedError
from trainer.experiments.grid import parse_spec, plan, run_grid

SPEC = """# two runs, 2 folds x 2 seeds each
a  --algorithm fedavg --subjects 1-4 --protocol kfold:2 --rounds 1 --seeds 0,1
b  --algorithm fedbs  --subjects 1-4 --protocol kfold:2 --rounds 1 --seeds 0,1 --no-ea
"""


def fake_job(cfg: dict, fold: int, test_subjects: list[int], seed: int, path: str, threads: int) -> dict:
    """Stand-in for simulate's job: writes its JSON like the real one (no training)."""
    if os.environ.get("GRID_TEST_FAIL") == f"{cfg['algorithm']}:{seed}:{fold}":
        raise RuntimeError("boom in the job")
    res = {"fold": fold, "seed": seed, "test_subjects": [f"S{s:03d}" for s in test_subjects],
           "per_subject": {f"S{s:03d}": {"bca": 0.5 + 0.1 * seed} for s in test_subjects},
           "curve": [], "participation": {}, "seconds": 0.0, "data_hashes": {}}
    Path(path).write_text(json.dumps(res))
    return res


@pytest.fixture
def spec(tmp_path, data_dir, monkeypatch) -> Path:
    monkeypatch.setenv("NEUROFED_DATA", str(data_dir))
    p = tmp_path / "grid.txt"
    p.write_text(SPEC)
    return p


def test_spec_lines_parse_like_simulate(spec, tmp_path):
    runs = parse_spec(spec, tmp_path / "res")
    assert [r.name for r in runs] == ["a", "b"]
    assert runs[0].cfg.subjects == [1, 2, 3, 4] and runs[0].cfg.seeds == [0, 1]
    assert runs[1].cfg.preprocess["ea"] is False and runs[1].out == tmp_path / "res" / "grid" / "b"
    bad = tmp_path / "bad.txt"
    bad.write_text("x --algorithm fedavg --roundz 3\n")
    with pytest.raises(NeuroFedError, match=r"bad.txt:1 \(x\)"):
        parse_spec(bad, tmp_path / "res")


def test_grid_resumes_from_finished_jobs(spec, tmp_path, monkeypatch):
    runs = parse_spec(spec, tmp_path / "res")
    # one job of run a already finished (e.g. by an interrupted grid): it is not run again
    (runs[0].out / "jobs").mkdir(parents=True)
    fake_job(runs[0].cfg.__dict__, 0, [1, 2], 0, str(runs[0].out / "jobs" / "seed0_fold00.json"), 1)
    tasks, done = plan(runs)
    assert len(tasks) == 7 and len(done["a"]) == 1
    calls = []

    def counting(*args):
        calls.append(args[1:4])
        return fake_job(*args)

    out = run_grid(runs, backend="pool", workers=1, job_fn=counting)
    assert out["failed"] == [] and sorted(out["finished"]) == ["a", "b"]
    assert len(calls) == 7
    res = json.loads((runs[0].out / "results.json").read_text())
    assert sorted(res["per_seed"]) == ["0", "1"] and len(res["per_subject"]) == 4
    calls.clear()  # everything finished: a re-run only re-summarises
    out = run_grid(runs, backend="pool", workers=1, job_fn=counting)
    assert calls == [] and sorted(out["finished"]) == ["a", "b"]


def test_failed_job_reported_with_traceback_and_retried_on_rerun(spec, tmp_path, monkeypatch):
    runs = parse_spec(spec, tmp_path / "res")
    monkeypatch.setenv("GRID_TEST_FAIL", "fedbs:1:0")
    out = run_grid(runs, backend="pool", workers=2, job_fn=fake_job)
    assert len(out["failed"]) == 1
    assert out["failed"][0].startswith("b seed 1 fold 0") and "RuntimeError: boom in the job" in out["failed"][0]
    assert out["finished"] == ["a"] and not (runs[1].out / "results.json").exists()
    monkeypatch.delenv("GRID_TEST_FAIL")
    assert len(plan(runs)[0]) == 1  # only the failed job is left
    out = run_grid(runs, backend="pool", workers=1, job_fn=fake_job)
    assert out["failed"] == [] and (runs[1].out / "results.json").exists()


@pytest.mark.slow
def test_grid_on_local_ray(spec, tmp_path):
    pytest.importorskip("ray")
    runs = parse_spec(spec, tmp_path / "res", only=["a"])
    out = run_grid(runs, backend="ray", workers=1, job_fn=fake_job)
    assert out == {"finished": ["a"], "failed": []}
    assert len(list((runs[0].out / "jobs").glob("*.json"))) == 4
