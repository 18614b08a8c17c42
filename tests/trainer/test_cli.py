"""The ``neurofed simulate`` / ``report`` commands on real data, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from neurofed.cli import app


def test_simulate_ct_loso_writes_results_and_resumes(tmp_path, data_dir):
    out = tmp_path / "run"
    args = ["simulate", "--algorithm", "ct", "--subjects", "1-3", "--rounds", "2", "--eval-every", "1",
            "--data-dir", str(data_dir), "--out", str(out), "--attack", "fgsm:0.03"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads((out / "results.json").read_text())
    assert sorted(r["per_subject"]) == ["S001", "S002", "S003"]
    assert 0.0 <= r["summary"]["bca"]["mean"] <= 1.0 and "fgsm@0.03" in r["summary"]
    assert r["config"]["seeds"] == [0] and len(r["data_hashes"]) == 9
    assert "mean ± std" in res.output
    # a rerun resumes: nothing is retrained, same results
    jobs = sorted(p.stat().st_mtime_ns for p in (out / "jobs").iterdir())
    res2 = CliRunner().invoke(app, args)
    assert res2.exit_code == 0
    assert sorted(p.stat().st_mtime_ns for p in (out / "jobs").iterdir()) == jobs
    assert json.loads((out / "results.json").read_text())["per_subject"] == r["per_subject"]
    rep = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0 and (tmp_path / "rep" / "per_subject_bca.png").stat().st_size > 1000
    # more seeds extend the run: seed 0's jobs are kept, seed 1's added, results average over both
    res3 = CliRunner().invoke(app, [*args[:-2], "--seeds", "0,1", *args[-2:]])
    assert res3.exit_code == 0, res3.output
    assert sorted(p.name for p in (out / "jobs").iterdir()) == ["seed0_fold00.json", "seed0_fold01.json",
                                                                 "seed0_fold02.json", "seed1_fold00.json",
                                                                 "seed1_fold01.json", "seed1_fold02.json"]
    assert json.loads((out / "results.json").read_text())["config"]["seeds"] == [0, 1]
    rep2 = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep2")])
    assert rep2.exit_code == 0
    row = next(ln for ln in (tmp_path / "rep2" / "report.md").read_text().splitlines() if ln.startswith("| run "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["3", "2"]  # 3 subjects, 2 seeds actually run
    assert float(cells[-2]) >= 0.0  # the std over seeds is shown once there are two (then: p vs ct)
    # any other change is refused with one line
    res4 = CliRunner().invoke(app, [*args, "--lr", "0.1"])
    assert res4.exit_code != 0 and "different configuration" in str(res4.exception)
    proc = subprocess.run([sys.executable, "-m", "neurofed.cli", *args, "--lr", "0.1"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "different configuration" in proc.stderr and "Traceback" not in proc.stderr


def test_simulate_without_held_out_saves_checkpoint(tmp_path, data_dir):
    out = tmp_path / "deploy"
    res = CliRunner().invoke(app, ["simulate", "--algorithm", "fedbs", "--subjects", "1-4", "--rounds", "1",
                                   "--test-subjects", "none", "--data-dir", str(data_dir), "--out", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads((out / "results.json").read_text())
    from neurofed.trainer.checkpoint import load_checkpoint

    _model, meta = load_checkpoint(r["checkpoints"][0])
    assert meta.strategy == "fedbs" and meta.bn_mode == "batch_specific" and meta.n_channels == 21


def test_bad_data_dir_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "neurofed.cli", "simulate", "--data-dir", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_default_simulate_leaves_chance_and_paper_preset_does_not(tmp_path, data_dir, small_cfg):
    """No default run trains to chance: `neurofed simulate` with its defaults (the published protocol) learns
    on real data in a few rounds; the papers' lr 0.005 / batch 32 stays at the chance-level loss (ln 2)."""
    from neurofed.trainer.checkpoint import load_checkpoint
    from neurofed.trainer.data import load_subjects
    from neurofed.trainer.evaluate import bca, predict

    base = ["simulate", "--algorithm", "fedavg", "--subjects", "1-4", "--rounds", "6", "--test-subjects", "none",
            "--threads", "1", "--data-dir", str(data_dir)]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    job = json.loads((tmp_path / "d" / "jobs" / "seed0_fold00.json").read_text())
    assert job["curve"][-1]["loss"] < 0.62  # chance: ln 2 = 0.693
    model, meta = load_checkpoint(job["checkpoint"])
    assert meta.preprocess["resample"] == 80.0 and len(meta.ch_names) == 21  # the published input format
    train = load_subjects([1, 2, 3, 4], small_cfg, data_dir)
    assert sum(bca(sd.y, predict(model, sd.X, 8)) for sd in train) / 4 > 0.6
    res = CliRunner().invoke(app, [*base, "--preset", "paper", "--channels", "sensorimotor21", "--resample", "80",
                                   "--out", str(tmp_path / "p")])
    assert res.exit_code == 0 and "45" in res.output  # the caveat is printed
    job = json.loads((tmp_path / "p" / "jobs" / "seed0_fold00.json").read_text())
    assert job["curve"][-1]["loss"] > 0.66


def test_runs_made_before_a_config_field_existed_still_resume():
    from dataclasses import asdict

    from neurofed.trainer.experiments.simulate import SimConfig, run_differences

    new = asdict(SimConfig(subjects=[1, 2], seeds=[0, 1]))
    old = {k: v for k, v in new.items() if k not in ("byzantine", "folds")}
    old["seeds"] = [0]
    assert not run_differences(old, new)  # fields added later, at their defaults, do not block resuming
    assert run_differences(old, {**new, "byzantine": "0.2:scale:10"})


def test_folds_option_runs_a_subset(tmp_path, data_dir):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["simulate", "--algorithm", "fedavg", "--subjects", "1-4", "--protocol", "kfold:2",
                                   "--folds", "1", "--rounds", "1", "--threads", "1", "--data-dir", str(data_dir),
                                   "--out", str(out), "--byzantine", "0.34:signflip"])
    assert res.exit_code == 0, res.output
    assert [p.name for p in (out / "jobs").iterdir()] == ["seed0_fold01.json"]
    job = json.loads((out / "jobs" / "seed0_fold01.json").read_text())
    assert len(job["attackers"]) == 1 and len(job["per_subject"]) == 2

def test_runs_made_when_local_bn_mode_was_a_config_field_still_resume():
    """fleeg_eegnet's local BN moved from a SimConfig field to the strategy parameter local_bn_mode."""
    from dataclasses import asdict

    from neurofed.trainer.experiments.simulate import SimConfig, run_differences

    new = asdict(SimConfig(subjects=[1, 2]))
    assert not run_differences({**new, "local_bn_mode": None}, new)
    moved = asdict(SimConfig(subjects=[1, 2], strategy_overrides={"local_bn_mode": "batch_specific"}))
    assert not run_differences({**new, "local_bn_mode": "batch_specific"}, moved)
    assert run_differences({**new, "local_bn_mode": "batch_specific"}, new)


def test_a_run_resumes_from_another_spelling_of_its_data_folder_and_a_refusal_names_the_field(
        tmp_path, data_dir, monkeypatch):
    """The data folder counts by the files it names; any other difference is refused with the field in the message."""
    from dataclasses import asdict

    import pytest

    from neurofed.trainer.data.eegmmidb import subjects_root
    from neurofed.trainer.errors import NeuroFedError
    from neurofed.trainer.experiments.simulate import SimConfig, refuse_other_run, run_differences

    root = subjects_root(data_dir)
    monkeypatch.setenv("NEUROFED_DATA", str(data_dir))
    old = asdict(SimConfig(subjects=[1, 2], data_dir=None))
    for spelling in (str(data_dir), str(root), os.path.relpath(root)):
        assert not run_differences(old, {**old, "data_dir": spelling}), spelling
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert run_differences(old, {**old, "data_dir": str(other)}) == [f"data_dir: None -> {str(other)!r}"]
    assert run_differences(old, {**old, "rounds": 7}) == [f"rounds: {old['rounds']!r} -> 7"]
    with pytest.raises(NeuroFedError, match=r"\(rounds: \d+ -> 7\); only --seeds may be extended"):
        refuse_other_run(tmp_path, old, {**old, "rounds": 7})
    refuse_other_run(tmp_path, old, {**old, "seeds": [0, 1]})  # more seeds: resumes
    with pytest.raises(NeuroFedError, match=r"seeds: \[0, 1\] -> \[0\] \(seeds may only be added\)"):
        refuse_other_run(tmp_path, {**old, "seeds": [0, 1]}, old)
    with pytest.raises(NeuroFedError, match=r"seeds: \[0\] -> \[2\]"):  # other seeds, not only fewer
        refuse_other_run(tmp_path, old, {**old, "seeds": [2]})


def test_integer_lists_parse_and_a_bad_one_is_named():
    import pytest
    import typer

    from neurofed.trainer.options import parse_int_list

    assert parse_int_list("2", "--seeds") == [2]
    assert parse_int_list("0, 1,,2", "--seeds") == [0, 1, 2]
    assert parse_int_list("", "--folds") == []
    with pytest.raises(typer.BadParameter, match=r"--folds '0,x': expected comma-separated integers"):
        parse_int_list("0,x", "--folds")


def test_a_bad_seed_list_is_one_clear_line_for_every_command(tmp_path, data_dir):
    runner = CliRunner()
    for args in (["report", str(tmp_path), "--seeds", "a"], ["grid", str(tmp_path / "g.txt"), "--reproduce",
                                                             "--seeds", "0;1"]):
        if args[0] == "grid":
            (tmp_path / "g.txt").write_text(f"x --algorithm fedavg --rounds 1 --data-dir {data_dir}\n")
        res = runner.invoke(app, args)
        assert res.exit_code != 0
        assert "expected comma-separated integers" in res.output, res.output
        assert "Traceback" not in res.output
