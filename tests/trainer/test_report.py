"""``neurofed report --seeds``: restricting runs to some seeds recomputes per-subject means and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from neurofed.cli import app


def _run(tmp_path, name: str, per_seed: dict) -> str:
    d = tmp_path / name
    d.mkdir()
    from neurofed.trainer.experiments.simulate import aggregate_seeds

    per_subject, summary = aggregate_seeds(per_seed)
    r = {"algorithm": name, "model": "eegnet", "config": {"seeds": [int(k) for k in per_seed], "preprocess": {}},
         "summary": summary, "per_subject": per_subject, "per_seed": per_seed, "curve": []}
    (d / "results.json").write_text(json.dumps(r))
    return str(d)


def _table_head(md: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith("| algorithm |"))


def test_report_seeds_keeps_only_those_seeds(tmp_path):
    subs = ["S001", "S002", "S003", "S004"]
    a = _run(tmp_path, "fedavg", {"0": {s: {"bca": 0.6} for s in subs}, "1": {s: {"bca": 0.8} for s in subs}})
    b = _run(tmp_path, "ablation", {"0": {s: {"bca": 0.6 + 0.01 * i} for i, s in enumerate(subs)}})
    res = CliRunner().invoke(app, ["report", a, b, "--out", str(tmp_path / "all")])
    assert res.exit_code == 0, res.output
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in (tmp_path / "all" / "report.md").read_text().splitlines() if ln.startswith("| ")}
    assert rows["fedavg"][2] == "2" and rows["fedavg"][3].startswith("70.0")  # mean of seeds 0 and 1
    res = CliRunner().invoke(app, ["report", a, b, "--seeds", "0", "--out", str(tmp_path / "s0")])
    assert res.exit_code == 0, res.output
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in (tmp_path / "s0" / "report.md").read_text().splitlines() if ln.startswith("| ")}
    assert rows["fedavg"][2] == "1" and rows["fedavg"][3].startswith("60.0 ± 0.0")
    assert rows["ablation"][3].startswith("61.5")
    # paired over seed 0 only: differences 0, 1, 2, 3 points
    assert rows["ablation"][-1] == f"{stats.ttest_rel([0.6, 0.61, 0.62, 0.63], [0.6] * 4).pvalue:.3g}"


@pytest.mark.parametrize("seeds,msg", [("7", "none of [7]"), ("x", "comma-separated integers")])
def test_report_seeds_errors_name_the_problem(tmp_path, seeds, msg):
    a = _run(tmp_path, "fedavg", {"0": {s: {"bca": 0.6} for s in ["S001", "S002", "S003"]}})
    res = CliRunner().invoke(app, ["report", a, "--seeds", seeds, "--out", str(tmp_path / "r")])
    assert res.exit_code != 0 and msg in res.output


def test_report_refs_chooses_the_p_value_columns(tmp_path):
    subs = ["S001", "S002", "S003"]
    a = _run(tmp_path, "fedbs", {"0": {s: {"bca": 0.6} for s in subs}})
    b = _run(tmp_path, "fedbs_e1", {"0": {s: {"bca": 0.5 + 0.01 * i} for i, s in enumerate(subs)}})
    res = CliRunner().invoke(app, ["report", a, b, "--refs", "fedbs", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    head = _table_head((tmp_path / "r" / "report.md").read_text())
    assert head.rstrip(" |").endswith("p vs fedbs") and "p vs ct" not in head


def test_report_p_metrics_adds_robustness_p_values(tmp_path):
    subs = ["S001", "S002", "S003", "S004"]
    a = _run(tmp_path, "fedavg", {"0": {s: {"bca": 0.6, "pgd@0.03": 0.2} for s in subs}})
    b = _run(tmp_path, "safe", {"0": {s: {"bca": 0.6, "pgd@0.03": 0.3 + 0.01 * i} for i, s in enumerate(subs)}})
    res = CliRunner().invoke(app, ["report", a, b, "--p-metrics", "bca,pgd@0.03", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "r" / "report.md").read_text().splitlines()
    assert _table_head("\n".join(lines)).rstrip(" |").endswith("p vs fedavg | p vs fedavg (pgd@0.03)")
    safe = [c.strip() for c in next(ln for ln in lines if ln.startswith("| safe")).strip("|").split("|")]
    want = stats.ttest_rel([0.3, 0.31, 0.32, 0.33], [0.2] * 4).pvalue
    assert safe[-2:] == ["1", f"{want:.3g}"]  # equal benign BCA: p 1; PGD: paired test
    # a reference without the metric (a classical run has no PGD numbers): its robustness p column is "-"
    c = _run(tmp_path, "riemann", {"0": {s: {"bca": 0.62 + 0.01 * i} for i, s in enumerate(subs)}})
    res = CliRunner().invoke(app, ["report", a, b, c, "--refs", "riemann", "--p-metrics", "bca,pgd@0.03",
                                   "--out", str(tmp_path / "r3")])
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "r3" / "report.md").read_text().splitlines()
    safe = [c.strip() for c in next(ln for ln in lines if ln.startswith("| safe")).strip("|").split("|")]
    assert safe[-1] == "-" and safe[-2] != "-"
    bad = CliRunner().invoke(app, ["report", a, "--p-metrics", "fgsm@0.1", "--out", str(tmp_path / "r2")])
    assert bad.exit_code != 0 and "no run has it" in bad.output


def _full_run(tmp_path, name: str, algorithm: str, local_epochs: int = 2) -> str:
    """A results.json as ``neurofed simulate`` writes it (3 subjects, LOSO, one seed, 3 rounds)."""
    from dataclasses import asdict

    from neurofed.trainer.data import PreprocessConfig
    from neurofed.trainer.experiments.simulate import SimConfig, aggregate_seeds
    from neurofed.trainer.fl.local import LocalConfig

    cfg = SimConfig(algorithm=algorithm, subjects=[1, 2, 9], rounds=3, eval_every=1, attacks=[["pgd", 0.03]],
                    local=LocalConfig(0.05, 0.9, 1e-4, 8, local_epochs).to_dict(),
                    preprocess=PreprocessConfig.from_preset("sensorimotor21", resample=80.0).to_dict())
    per_seed = {"0": {"S001": {"bca": 0.6}, "S002": {"bca": 0.7}, "S009": {"bca": 0.9}}}
    per_subject, summary = aggregate_seeds(per_seed)
    r = {"algorithm": algorithm, "model": "eegnet", "config": asdict(cfg), "strategy": cfg.strategy().to_dict(),
         "summary": summary, "per_subject": per_subject, "per_seed": per_seed,
         "curve": [{"round": k, "bca": 0.5 + 0.05 * k} for k in (1, 2, 3)],
         "data_hashes": {f"S{s:03d}R{r:02d}.edf": "x" for s in (1, 2, 9) for r in (4, 8, 12)}}
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(r))
    return str(d)


def test_report_opens_with_the_protocol_and_uses_the_sample_std(tmp_path):
    a = _full_run(tmp_path, "fedbs", "fedbs")
    b = _full_run(tmp_path, "fedbs_e1", "fedbs", local_epochs=1)
    res = CliRunner().invoke(app, ["report", a, b, "--refs", "fedbs", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "report.md").read_text()
    proto = md.split("## Protocol", 1)[1].split("## Results", 1)[0]
    for want in ("EEGMMIDB", "runs 4/8/12", "**subjects**: 3: S001-S002, S009", "leave-one-subject-out (3 folds",
                 "eegnet, batch_specific BN, test batch 8", "21 sensorimotor channels", "band-pass 8.0-30.0 Hz",
                 "80 Hz", "Euclidean alignment", "client SGD lr 0.05", "client batch 8", "3 rounds, 0.5 of the clients",
                 "**seeds**: 0", "pgd eps 0.03"):
        assert want in proto, want
    # what differs between the runs is said per run, not mixed into the shared lines
    assert "`fedbs_e1`: optimiser:" in proto and "1 local epoch(s)" in proto
    assert md.index("## Protocol") < md.index("| algorithm |")
    row = next(ln for ln in md.splitlines() if ln.startswith("| fedbs |"))
    assert f"73.3 ± {100 * np.std([0.6, 0.7, 0.9], ddof=1):.1f}" in row  # sample std 15.3, not 12.5
    assert "ddof=1" in md
    assert (tmp_path / "r" / "learning_curves.png").is_file()


def test_report_warns_when_a_refs_name_matches_no_run(tmp_path):
    a = _full_run(tmp_path, "fedbs", "fedbs")
    res = CliRunner().invoke(app, ["report", a, "--refs", "fedavg", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "--refs fedavg: no run of algorithm 'fedavg'" in res.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "**Warning**: --refs fedavg: no run of algorithm 'fedavg' among the runs given (fedbs)" in md
    assert "p vs" not in _table_head(md)


@pytest.mark.parametrize("partition, want", [
    ("subject", "(one client per training subject)"),
    ("dirichlet:0.05", "(Dirichlet(0.05) label skew: each training subject's trials split over 2 clients)"),
    ("dirichlet:0.1:3", "(Dirichlet(0.1) label skew: each training subject's trials split over 3 clients)"),
    ("missing-class", "(partition missing-class: each training subject's trials split over several clients)"),
])
def test_report_protocol_names_the_client_partition(partition, want):
    from neurofed.trainer.report import protocol_of

    run = {"algorithm": "fedavg", "config": {"rounds": 50, "fraction": 0.5, "partition": partition}}
    assert protocol_of(run)["rounds"] == f"50 rounds, 0.5 of the clients per round {want}"


def test_learning_curve_per_seed_is_tabulated_and_follows_seeds(tmp_path):
    """summarise keeps each seed's curve; the report tabulates mean (per seed) and --seeds restricts it."""
    from neurofed.trainer.experiments.simulate import mean_curve

    jobs = [{"seed": s, "fold": k, "curve": [{"round": 1, "loss": 1.0}, {"round": 10, "bca": b}, {"round": 20, "bca": b + 0.1}]}
            for s, k, b in ((0, 0, 0.5), (0, 1, 0.6), (1, 0, 0.7), (1, 1, 0.8))]
    assert mean_curve(jobs) == [{"round": 10, "bca": pytest.approx(0.65)}, {"round": 20, "bca": pytest.approx(0.75)}]
    d = Path(_full_run(tmp_path, "fedbs", "fedbs"))
    r = json.loads((d / "results.json").read_text())
    r["per_seed"] = {"0": r["per_seed"]["0"], "1": {k: {"bca": 0.5} for k in r["per_seed"]["0"]}}
    r["curve"] = mean_curve(jobs)
    r["curve_per_seed"] = {str(s): mean_curve([j for j in jobs if j["seed"] == s]) for s in (0, 1)}
    (d / "results.json").write_text(json.dumps(r))
    res = CliRunner().invoke(app, ["report", str(d), "--refs", "fedbs", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| run | round 10 | round 20 |" in md
    assert "| fedbs | 65.0 (55.0 / 75.0) | 75.0 (65.0 / 85.0) |" in md  # mean over both seeds, then each seed
    res = CliRunner().invoke(app, ["report", str(d), "--refs", "fedbs", "--seeds", "1", "--out", str(tmp_path / "r1")])
    assert res.exit_code == 0, res.output
    assert "| fedbs | 75.0 | 85.0 |" in (tmp_path / "r1" / "report.md").read_text()  # seed 1 only


def test_paired_comparison_hand_computed_case():
    from neurofed.trainer.report import paired_comparison

    x = {"S001": 0.6, "S002": 0.7, "S003": 0.8, "S004": 0.9, "S009": 0.5}  # S009 only in x: not compared
    y = {"S001": 0.5, "S002": 0.5, "S003": 0.5, "S004": 0.9}
    c = paired_comparison(x, y)
    # differences 0.1, 0.2, 0.3, 0: mean 0.15; higher on 3 of 4; Wilcoxon drops the zero, ranks 1, 2, 3 all
    # positive: W- = 0, exact two-sided p = 2 * P(W <= 0) = 2 / 2**3 = 0.25
    assert c["n"] == 4 and c["higher"] == 3
    assert c["diff"] == pytest.approx(0.15)
    assert c["wilcoxon_p"] == pytest.approx(0.25)
    d = np.array([0.1, 0.2, 0.3, 0.0])
    t = d.mean() / (d.std(ddof=1) / 2)  # paired t, 3 degrees of freedom
    assert c["t_p"] == pytest.approx(2 * stats.t.sf(t, 3))
    assert paired_comparison(x, dict(x)) == {"n": 5, "diff": 0.0, "higher": 0, "t_p": 1.0, "wilcoxon_p": 1.0}
    assert paired_comparison({"S001": 0.6, "S002": 0.7}, {"S001": 0.5, "S002": 0.5}) is None  # < 3 subjects


def test_report_tabulates_paired_comparisons_against_each_ref(tmp_path):
    subs = ["S001", "S002", "S003", "S004"]
    a = _run(tmp_path, "fedavg", {"0": dict(zip(subs, ({"bca": v} for v in (0.5, 0.5, 0.5, 0.9))))})
    b = _run(tmp_path, "fedbm", {"0": dict(zip(subs, ({"bca": v} for v in (0.6, 0.7, 0.8, 0.9))))})
    res = CliRunner().invoke(app, ["report", a, b, "--refs", "fedavg,fedbm", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Paired comparisons (BCA)" in md
    rows = [ln for ln in md.splitlines() if " − " in ln and ln.startswith("| ")]
    p = f"{stats.ttest_rel([0.6, 0.7, 0.8, 0.9], [0.5, 0.5, 0.5, 0.9]).pvalue:.2g}"
    assert rows == [f"| fedbm − fedavg | 4 | +15.0 | {p} | 0.25 | 3 of 4 |",
                    f"| fedavg − fedbm | 4 | -15.0 | {p} | 0.25 | 0 of 4 |"]


def test_clip_counts_are_summed_per_seed_and_reported_over_the_seeds_shown(tmp_path):
    """summarise keeps each seed's count of server-clipped updates; the report sums the seeds it shows."""
    from neurofed.trainer.experiments.simulate import clip_summary

    def job(seed, clipped=None):
        cost = {"robust.stat_clipped": float(clipped)} if clipped is not None else {}
        return {"seed": seed, "server_cost": cost, "curve": [{"round": r, "participants": 9} for r in (1, 2)]}

    jobs = [job(0, 3), job(0, 1), job(1, 0), job(2)]  # seed 2's job predates the count
    assert clip_summary(jobs) == {"0": {"clipped": 4, "updates": 36, "jobs": 2}, "1": {"clipped": 0, "updates": 18, "jobs": 1}}
    assert clip_summary([job(0)]) == {}
    subs = ["S001", "S002", "S003"]
    d = Path(_run(tmp_path, "fal", {k: {s: {"bca": 0.6} for s in subs} for k in ("0", "1", "2")}))
    r = json.loads((d / "results.json").read_text())
    (d / "results.json").write_text(json.dumps({**r, "clipping": clip_summary(jobs)}))
    res = CliRunner().invoke(app, ["report", str(d), "--out", str(tmp_path / "all")])
    assert res.exit_code == 0, res.output
    assert "- `fal`: 4 of 54 client updates clipped (7.4 %), in the 3 job(s) that count it" in (
        tmp_path / "all" / "report.md").read_text()
    res = CliRunner().invoke(app, ["report", str(d), "--seeds", "1,2", "--out", str(tmp_path / "s12")])
    assert res.exit_code == 0, res.output
    assert "- `fal`: 0 of 18 client updates clipped (0.0 %), in the 1 job(s) that count it" in (
        tmp_path / "s12" / "report.md").read_text()
    res = CliRunner().invoke(app, ["report", str(d), "--seeds", "2", "--out", str(tmp_path / "s2")])
    assert "Server-side clipping" not in (tmp_path / "s2" / "report.md").read_text()  # seed 2 does not count it
