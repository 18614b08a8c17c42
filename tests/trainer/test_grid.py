"""``neurofed grid``: one task per (run, seed, fold), resumed from finished job JSONs, failures with tracebacks."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from neurofed.trainer.cli import grid
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.grid import (
    compare_jobs,
    parse_spec,
    plan,
    reproduce_grid,
    run_grid,
    select_seeds,
)

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


def test_data_folder_from_the_environment_stays_out_of_the_config(spec, tmp_path, monkeypatch, data_dir):
    """$NEUROFED_DATA is this machine's: a run's config.json records only a folder the spec line names."""
    monkeypatch.setenv("NEUROFED_DATA", str(data_dir))
    assert [r.cfg.data_dir for r in parse_spec(spec, tmp_path / "res")] == [None, None]
    named = tmp_path / "named.txt"
    named.write_text(f"a --algorithm fedavg --subjects 1-4 --data-dir {data_dir}\n")
    assert parse_spec(named, tmp_path / "res")[0].cfg.data_dir == str(data_dir)


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


def test_resume_leaves_a_committed_config_as_it_was(spec, tmp_path):
    """A plain resume does not rewrite config.json: a committed file laid out otherwise shows no diff afterwards."""
    runs = parse_spec(spec, tmp_path / "res")
    run_grid(runs, backend="pool", workers=1, job_fn=fake_job)
    cfg_path = runs[0].out / "config.json"
    relaid = json.dumps(json.loads(cfg_path.read_text()), indent=2, sort_keys=True)
    cfg_path.write_text(relaid)
    run_grid(parse_spec(spec, tmp_path / "res"), backend="pool", workers=1, job_fn=fake_job)
    assert cfg_path.read_text() == relaid
    (tmp_path / "more").mkdir()
    more = tmp_path / "more" / "grid.txt"  # same group (the spec's name); more seeds do rewrite it, seed list and all
    more.write_text(SPEC.replace("--seeds 0,1\n", "--seeds 0,1,2\n", 1))
    run_grid(parse_spec(more, tmp_path / "res")[:1], backend="pool", workers=1, job_fn=fake_job)
    assert json.loads(cfg_path.read_text())["seeds"] == [0, 1, 2]


@pytest.mark.integration
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


def test_grid_seeds_runs_only_those_and_summarises_once_all_spec_seeds_are_done(spec, tmp_path):
    runs = parse_spec(spec, tmp_path / "res", only=["a"])
    calls = []

    def counting(*args):
        calls.append(args[3])
        return fake_job(*args)

    out = run_grid(runs, backend="pool", workers=1, job_fn=counting, seeds=[1])
    assert calls == [1, 1] and out == {"finished": [], "failed": []}
    assert not (runs[0].out / "results.json").exists()  # seed 0 is still to run: no partial summary
    calls.clear()
    out = run_grid(runs, backend="pool", workers=1, job_fn=counting)  # the rest of the spec
    assert calls == [0, 0] and out["finished"] == ["a"]
    assert sorted(json.loads((runs[0].out / "results.json").read_text())["per_seed"]) == ["0", "1"]
    with pytest.raises(NeuroFedError, match=r"a: seed\(s\) \[5\] are not in its spec line's --seeds \[0, 1\]"):
        grid(spec, results=tmp_path / "res", only="a", seeds="5")


@pytest.mark.integration
@pytest.mark.slow
def test_grid_on_local_ray(spec, tmp_path):
    pytest.importorskip("ray")
    runs = parse_spec(spec, tmp_path / "res", only=["a"])
    out = run_grid(runs, backend="ray", workers=1, job_fn=fake_job)
    assert out == {"finished": ["a"], "failed": []}
    assert len(list((runs[0].out / "jobs").glob("*.json"))) == 4


def job_with_model(cfg: dict, fold: int, test_subjects: list[int], seed: int, path: str, threads: int) -> dict:
    """fake_job that also saves a 'model' beside its JSON (as --save-models does); fold 1 of seed 1 drifts
    when GRID_TEST_DRIFT is set (a job that does not reproduce)."""
    res = fake_job(cfg, fold, test_subjects, seed, path, threads)
    if os.environ.get("GRID_TEST_DRIFT") and (seed, fold) == (1, 1):
        res["per_subject"][f"S{test_subjects[0]:03d}"]["bca"] += 0.01
    ckpt = Path(path).with_suffix(".safetensors")
    ckpt.write_bytes(f"model {cfg['algorithm']} {seed} {fold}".encode())
    res["checkpoints"] = [str(ckpt)]
    Path(path).write_text(json.dumps(res))
    return res


@pytest.mark.integration
def test_reproduce_checks_each_job_and_places_models_only_when_equal(spec, tmp_path, monkeypatch):
    runs = parse_spec(spec, tmp_path / "res")
    assert run_grid(runs, backend="pool", workers=1, job_fn=job_with_model)["failed"] == []
    committed = {p: p.read_bytes() for r in runs for p in (r.out / "jobs").glob("*.json")}
    for r in runs:  # a fresh clone: job JSONs only, the models are not in git
        for m in (r.out / "jobs").glob("*.safetensors"):
            m.unlink()
    monkeypatch.setenv("GRID_TEST_DRIFT", "1")
    seen = []
    checks = reproduce_grid(runs, tmp_path / "scratch", backend="pool", workers=2, seeds=[1],
                            on_check=lambda c, n, total: seen.append((n, total)), job_fn=job_with_model)
    assert seen[-1] == (4, 4) and sorted((c.run, c.seed, c.fold) for c in checks) == [
        ("a", 1, 0), ("a", 1, 1), ("b", 1, 0), ("b", 1, 1)]
    status = {(c.run, c.fold): c for c in checks}
    assert [status[k].status for k in [("a", 0), ("a", 1), ("b", 0), ("b", 1)]] == [
        "equal", "differs", "equal", "differs"]
    assert len(status["a", 1].details) == 1 and re.fullmatch(r"S00\d bca 0.61 vs 0.6", status["a", 1].details[0])
    # equal jobs get their model back, byte for byte; a job that differs gets nothing, and no JSON changed
    a = runs[0].out / "jobs"
    assert (a / "seed1_fold00.safetensors").read_bytes() == b"model fedavg 1 0"
    assert status["a", 0].placed == [str(a / "seed1_fold00.safetensors")]
    assert not (a / "seed1_fold01.safetensors").exists() and not (a / "seed0_fold00.safetensors").exists()
    assert {p: p.read_bytes() for r in runs for p in (r.out / "jobs").glob("*.json")} == committed
    # resumable: a second call re-checks the scratch jobs without re-running them
    calls = []
    checks = reproduce_grid(runs, tmp_path / "scratch", backend="pool", workers=1, seeds=[1],
                            job_fn=lambda *a: calls.append(a))
    assert calls == [] and sorted(c.status for c in checks) == ["differs", "differs", "equal", "equal"]
    # the same scratch folder then serves another seed: only seed 0's jobs run and are checked
    seen.clear()
    checks = reproduce_grid(runs, tmp_path / "scratch", backend="pool", workers=1, seeds=[0],
                            on_check=lambda c, n, total: seen.append((n, total)), job_fn=job_with_model)
    assert seen[-1] == (4, 4) and sorted((c.run, c.seed, c.fold, c.status) for c in checks) == [
        ("a", 0, 0, "equal"), ("a", 0, 1, "equal"), ("b", 0, 0, "equal"), ("b", 0, 1, "equal")]
    assert (a / "seed0_fold00.safetensors").read_bytes() == b"model fedavg 0 0"
    assert {p: p.read_bytes() for r in runs for p in (r.out / "jobs").glob("*.json")} == committed


def job_attacked(cfg: dict, fold: int, test_subjects: list[int], seed: int, path: str, threads: int) -> dict:
    """job_with_model with an attacked metric; under GRID_TEST_DRIFT_ATTACK seed 1's fold 0 drifts in benign BCA and its
    fold 1 in the attacked metric only (as FGSM can move by a trial between CPUs)."""
    res = job_with_model(cfg, fold, test_subjects, seed, path, threads)
    for row in res["per_subject"].values():
        row["fgsm@0.03"] = 0.3
    first = res["per_subject"][f"S{test_subjects[0]:03d}"]
    if os.environ.get("GRID_TEST_DRIFT_ATTACK") and seed == 1:
        first["bca" if fold == 0 else "fgsm@0.03"] += 0.02
    Path(path).write_text(json.dumps(res))
    return res


def test_reproduce_match_places_models_whose_named_metrics_equal(spec, tmp_path, monkeypatch):
    runs = parse_spec(spec, tmp_path / "res", only=["a"])
    assert run_grid(runs, backend="pool", workers=1, job_fn=job_attacked)["failed"] == []
    committed = {p: p.read_bytes() for p in (runs[0].out / "jobs").glob("*.json")}
    for m in (runs[0].out / "jobs").glob("*.safetensors"):
        m.unlink()
    monkeypatch.setenv("GRID_TEST_DRIFT_ATTACK", "1")
    checks = {c.fold: c for c in reproduce_grid(runs, tmp_path / "scratch", backend="pool", workers=1, seeds=[1],
                                                job_fn=job_attacked, match=["bca"])}
    assert checks[0].status == "differs" and checks[0].placed == []  # benign BCA moved: no model
    assert checks[1].status == "matches" and len(checks[1].details) == 1
    assert re.fullmatch(r"S00\d fgsm@0.03 0.32 vs 0.3", checks[1].details[0])
    jobs = runs[0].out / "jobs"
    assert checks[1].placed == [str(jobs / "seed1_fold01.safetensors")]
    assert (jobs / "seed1_fold01.safetensors").read_bytes() == b"model fedavg 1 1"
    assert {p: p.read_bytes() for p in jobs.glob("*.json")} == committed  # the committed numbers stay
    # without --match the same scratch jobs place nothing more and say why
    again = reproduce_grid(runs, tmp_path / "scratch", backend="pool", workers=1, seeds=[1], job_fn=job_attacked)
    assert sorted(c.status for c in again) == ["differs", "differs"]
    assert compare_jobs({"per_subject": {"S001": {"bca": 0.7, "x": 1.0}}},
                        {"per_subject": {"S001": {"bca": 0.7, "x": 2.0}}}, keys=["bca"]) == []
    # a metric name no committed job holds (a typo) is refused before anything runs, naming the ones there are
    calls = []
    with pytest.raises(NeuroFedError, match=r"--match bxa: no committed job has that metric \(they hold: bca, fgsm"):
        reproduce_grid(runs, tmp_path / "scratch2", backend="pool", workers=1, seeds=[1],
                       job_fn=lambda *a: calls.append(a), match=["bca", "bxa"])
    assert calls == []


def test_reproduce_refuses_what_cannot_be_compared(spec, tmp_path):
    runs = parse_spec(spec, tmp_path / "res")
    with pytest.raises(NeuroFedError, match=r"seed\(s\) \[2\] are not in"):
        select_seeds(runs, [2])
    with pytest.raises(NeuroFedError, match=r"seed\(s\) \[2\] are not in"):
        reproduce_grid(runs, tmp_path / "scratch", seeds=[2], job_fn=fake_job)
    with pytest.raises(NeuroFedError, match=r"a: 4 job\(s\) not finished .*without --reproduce"):
        reproduce_grid(runs, tmp_path / "scratch", backend="pool", job_fn=fake_job)
    assert not (runs[0].out / "config.json").exists()  # the check wrote nothing into the results root
    run_grid(runs, backend="pool", workers=1, job_fn=fake_job)
    other = tmp_path / "other.txt"  # the same run names with another option: not the committed runs' configuration
    other.write_text(SPEC.replace("--rounds 1", "--rounds 2"))
    with pytest.raises(NeuroFedError, match="another configuration.*rounds"):
        reproduce_grid(parse_spec(other, tmp_path / "res", group="grid"), tmp_path / "scratch", job_fn=fake_job)
    with pytest.raises(NeuroFedError, match="--scratch and --match go with --reproduce"):
        grid(spec, results=tmp_path / "res", scratch=tmp_path / "scratch")
    with pytest.raises(NeuroFedError, match="--scratch and --match go with --reproduce"):
        grid(spec, results=tmp_path / "res", match="bca")


def test_compare_jobs_names_each_difference():
    a = {"per_subject": {"S001": {"bca": 0.7, "fgsm_0.03": 0.4}, "S002": {"bca": 0.6}}}
    assert compare_jobs(a, json.loads(json.dumps(a))) == []
    b = {"per_subject": {"S001": {"bca": 0.7, "fgsm_0.03": 0.45}, "S002": {"bca": 0.6}}}
    assert compare_jobs(a, b) == ["S001 fgsm_0.03 0.4 vs 0.45"]
    assert compare_jobs(a, {"per_subject": {"S001": {"bca": 0.7}}})[0].startswith("held-out subjects differ")
