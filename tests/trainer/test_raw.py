"""A study's raw results in one ``raw.jsonl.gz``: packing, reading, TOML grid specs, and the grid and report CLIs
reading and extending it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from neurofed.trainer import cli as trainer_cli
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments import raw
from neurofed.trainer.experiments.grid import parse_spec, run_grid
from neurofed.trainer.report import ReportError, load_runs

TXT = """a  --algorithm fedavg --subjects 1-4 --protocol kfold:2 --rounds 1 --seeds 0,1
b  --algorithm fedbs  --subjects 1-4 --protocol kfold:2 --rounds 1 --seeds 0,1 --no-ea
"""
TOML = """# the same two runs as TXT, in group g; one more grid h
[g.common]
subjects = "1-4"
protocol = "kfold:2"
rounds = 1
seeds = "0,1"

[g.runs.a]
algorithm = "fedavg"

[g.runs.b]
algorithm = "fedbs"
ea = false

[h.runs.a]
algorithm = "fedavg"
subjects = "1-4"
protocol = "kfold:2"
rounds = 1
"""


def fake_job(cfg: dict, fold: int, test_subjects: list[int], seed: int, path: str, threads: int) -> dict:
    """Stand-in for simulate's job (no training): per-subject BCAs with floats that must round-trip exactly."""
    res = {"fold": fold, "seed": seed, "test_subjects": [f"S{s:03d}" for s in test_subjects],
           "per_subject": {f"S{s:03d}": {"bca": 0.1 + 0.2 * seed + s / 3} for s in test_subjects},
           "curve": [], "participation": {}, "seconds": 0.0, "data_hashes": {}}
    Path(path).write_text(json.dumps(res))
    return res


@pytest.fixture
def env(tmp_path, data_dir, monkeypatch) -> Path:
    monkeypatch.setenv("NEUROFED_DATA", str(data_dir))
    monkeypatch.chdir(tmp_path)  # raw.WORK (runs/studies) is relative to the checkout
    return tmp_path


def test_pack_round_trips_exactly_and_deterministically(tmp_path):
    root = tmp_path / "res"
    (root / "g" / "a" / "jobs").mkdir(parents=True)
    job = {"per_subject": {"S001": {"bca": 0.1 + 0.2}}, "x": [1e-300, 2 / 3]}
    (root / "g" / "a" / "jobs" / "seed0_fold00.json").write_text(json.dumps(job))
    (root / "g" / "a" / "results.json").write_text(json.dumps({"summary": {}, "per_subject": {}}))
    (root / "g" / "a.log").write_text("training log: not kept")
    (root / "other" / "z.json").parent.mkdir()
    (root / "other" / "z.json").write_text("{}")
    out = tmp_path / "raw.jsonl.gz"
    assert raw.pack(root, out, prefixes=["g"]) == 2
    first = out.read_bytes()
    assert raw.pack(root, out, prefixes=["g"]) == 2 and out.read_bytes() == first  # no time stamp in the gzip
    entries = raw.read(out)
    assert list(entries) == ["g/a/jobs/seed0_fold00.json", "g/a/results.json"]
    assert entries["g/a/jobs/seed0_fold00.json"] == job  # floats exactly
    assert raw.pack(root, out, exclude=["other"]) == 2
    dest = tmp_path / "unpacked"
    assert raw.unpack(out, dest) == 2 and json.loads((dest / "g/a/jobs/seed0_fold00.json").read_text()) == job
    assert raw.unpack(out, dest) == 0  # files already there are kept


def test_bad_raw_files_name_the_problem(tmp_path):
    with pytest.raises(NeuroFedError, match="raw results file not found"):
        raw.read(tmp_path / "missing.jsonl.gz")
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(NeuroFedError, match=r"bad.jsonl.gz: line 1 is not a raw results entry"):
        raw.read(bad)
    with gzip.open(bad, "wt") as f:
        f.write('{"path": "a.json", "json": {}}\n{"no path": 1}\n')
    with pytest.raises(NeuroFedError, match=r"line 2"):
        raw.read(bad)


def test_toml_spec_reads_like_the_line_spec(env):
    txt, toml = env / "g.txt", env / "spec.toml"
    txt.write_text(TXT)
    toml.write_text(TOML)
    a = parse_spec(txt, env / "res")
    b = parse_spec(toml, env / "res", group="g")
    assert [r.name for r in b] == ["a", "b"] and [r.cfg for r in a] == [r.cfg for r in b]
    assert [r.out for r in a] == [r.out for r in b] == [env / "res" / "g" / "a", env / "res" / "g" / "b"]
    both = parse_spec(toml, env / "res")  # several grids: runs are named group/run
    assert [r.name for r in both] == ["g/a", "g/b", "h/a"] and both[2].cfg.seeds == [0]
    assert [r.name for r in parse_spec(toml, env / "res", only=["h/a", "b"])] == ["g/b", "h/a"]
    with pytest.raises(NeuroFedError, match=r"no grid 'x' \(it has: g, h\)"):
        parse_spec(toml, env / "res", group="x")
    (env / "bad.toml").write_text("[g.runs.a]\nalgorithm = \"fedavg\"\nroundz = 3\n")
    with pytest.raises(NeuroFedError, match=r"bad.toml \[g.runs.a\]"):
        parse_spec(env / "bad.toml", env / "res")
    (env / "broken.toml").write_text("[g.runs.a\n")
    with pytest.raises(NeuroFedError, match="not a TOML grid spec"):
        parse_spec(env / "broken.toml", env / "res")


def test_a_new_study_s_first_grid_creates_its_raw_file(env, monkeypatch):
    study = env / "studies" / "new"
    study.mkdir(parents=True)
    (study / "spec.toml").write_text(TOML)
    import neurofed.trainer.experiments.grid as grid_mod

    monkeypatch.setattr(grid_mod, "run_grid", lambda *a, **k: run_grid(*a, **{**k, "job_fn": fake_job}))
    trainer_cli.grid(study / "spec.toml", group="g", results=None, only="a", backend="pool", address=None,
                     workers=1, reproduce=False, seeds=None, scratch=None, match=None)
    entries = raw.read(study / raw.RAW_NAME)  # not runs/grid: the study's own file, made by its first run
    assert sorted(e for e in entries if "/jobs/" in e) == [f"g/a/jobs/seed{s}_fold{f:02d}.json"
                                                         for s in (0, 1) for f in (0, 1)]
    assert not (env / "runs" / "grid").exists()
    # a spec outside studies/ keeps the plain results folder
    (env / "elsewhere.toml").write_text(TOML)
    trainer_cli.grid(env / "elsewhere.toml", group="g", results=None, only="a", backend="pool", address=None,
                     workers=1, reproduce=False, seeds=None, scratch=None, match=None)
    assert (env / "runs" / "grid" / "g" / "a" / "results.json").is_file()


def test_grid_cli_reads_and_extends_a_study_raw_file(env, monkeypatch):
    study = env / "studies" / "s"
    study.mkdir(parents=True)
    (study / "spec.toml").write_text(TOML)
    # committed: run g/a finished on another machine; its jobs are in the study's raw file only
    first = parse_spec(study / "spec.toml", env / "elsewhere", group="g")
    run_grid(first[:1], backend="pool", workers=1, job_fn=fake_job)
    raw.pack(env / "elsewhere", study / raw.RAW_NAME)
    calls = []

    def counting(*a):
        calls.append(a[1:4])
        return fake_job(*a)

    import neurofed.trainer.experiments.grid as grid_mod  # the command imports run_grid from here when it runs

    monkeypatch.setattr(grid_mod, "run_grid", lambda *a, **k: run_grid(*a, **{**k, "job_fn": counting}))
    trainer_cli.grid(study / "spec.toml", group="g", results=None, only=None, backend="pool", address=None,
                     workers=1, reproduce=False, seeds=None, scratch=None, match=None)
    assert len(calls) == 4 and all(c[0] in (0, 1) for c in calls)  # only run b's 2 folds x 2 seeds ran
    entries = raw.read(study / raw.RAW_NAME)
    assert "g/b/results.json" in entries and "g/a/jobs/seed1_fold01.json" in entries
    # a fresh checkout (no runs/): nothing left to run, everything comes from the raw file
    import shutil

    shutil.rmtree(env / "runs")
    calls.clear()
    trainer_cli.grid(study / "spec.toml", group="g", results=None, only=None, backend="pool", address=None,
                     workers=1, reproduce=False, seeds=None, scratch=None, match=None)
    assert calls == []
    # a re-run that only re-summarises leaves the committed file alone; files that are not a grid's stay out
    before = (study / raw.RAW_NAME).read_bytes()
    local = env / "runs" / "studies" / "results" / "g" / "a"
    (local / "sweep").mkdir()
    (local / "sweep" / "seed0_fold00.json").write_text("{}")
    trainer_cli.grid(study / "spec.toml", group="g", results=None, only=None, backend="pool", address=None,
                     workers=1, reproduce=False, seeds=None, scratch=None, match=None)
    assert (study / raw.RAW_NAME).read_bytes() == before
    assert raw.add_tree(study / raw.RAW_NAME, env / "runs" / "studies" / "results", [local / "sweep"]) == 1
    assert "g/a/sweep/seed0_fold00.json" in raw.read(study / raw.RAW_NAME)
    # the report reads the raw file directly, like the run folders
    direct = load_runs([Path(f"{study / raw.RAW_NAME}:g/b")])
    unpacked = load_runs([env / "runs" / "studies" / "results" / "g" / "b"])
    assert direct[0]["per_subject"] == unpacked[0]["per_subject"] and direct[0]["_dir"] == "g/b"
    assert [r["_dir"] for r in load_runs([study])] == ["g/a", "g/b"]
    assert [r["_dir"] for r in load_runs([Path(f"{study / raw.RAW_NAME}:g")], seeds=[1])] == ["g/a", "g/b"]
    with pytest.raises(ReportError, match=r"no run 'g/zz' \(it holds: g/a, g/b\)"):
        load_runs([Path(f"{study / raw.RAW_NAME}:g/zz")])
