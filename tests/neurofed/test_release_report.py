"""Live BCA per release beside the release gate's validation BCA (neurofed.release_report, ``neurofed release
report``): made-up decoded windows of two decoders and a release folder with three signed releases (the third a
rollback of the first) and the gate's history."""

from __future__ import annotations

import json

import pytest
from neurofed_runtime import release as rel
from typer.testing import CliRunner

from neurofed.broker.releases import ReleaseStore
from neurofed.release_report import live_by_release, read_predictions, release_report, summary_lines
from neurofed.trainer.errors import NeuroFedError


def _win(v, onset, cue, label=None, rejected=False):
    row = {"t_end": onset + 4.0, "model_version": v, "onset": onset, "cue": cue}
    return row | ({"rejected": "flat channel"} if rejected else {"label": label, "index": 0})


@pytest.fixture
def folder(tmp_path):
    """Releases 1, 2 (gate decisions at versions 2 and 4) and 3 = a rollback of 1."""
    priv, _ = rel.keygen(tmp_path / "keys")
    key = rel.load_private(priv)
    st = ReleaseStore(tmp_path / "releases")
    for v, parent, back in ((1, None, None), (2, 1, None), (3, 2, 1)):
        data = b"onnx-%d" % (back or v)
        st.add(data, rel.sign(data, key, v, parent, rollback_of=back, model_hash=""))
    history = [{"version": 2, "released": True, "release": 1, "n_clients": 2, "n_trials": 90, "bca_mean": 0.61},
               {"version": 3, "released": False, "release": None, "n_clients": 1, "n_trials": 45, "bca_mean": 0.5},
               {"version": 4, "released": True, "release": 2, "n_clients": 2, "n_trials": 90, "bca_mean": 0.66,
                "paired_diff_mean": 0.05}]
    (st.folder / "history.json").write_text(json.dumps(history))
    return st.folder


def test_live_bca_per_release_beside_validation(folder, tmp_path):
    a = [_win(1, 0, "left_fist", "left_fist"), _win(1, 1, "right_fist", "left_fist"),
         _win(2, 2, "left_fist", "left_fist"), _win(2, 3, "right_fist", "right_fist"), _win(2, 4, "left_fist", rejected=True),
         _win(3, 5, "right_fist", "right_fist"), {"t_end": 9.0, "label": "left_fist", "model_version": 3}]  # sliding
    b = [_win(2, 2.5, "right_fist", "left_fist"), _win(3, 5.5, "left_fist", "left_fist")]
    live = live_by_release(a)
    assert sorted(live) == [1, 2, 3]
    assert (live[1]["windows"], live[1]["n"], live[1]["bca"]) == (2, 2, 0.5)
    assert (live[2]["windows"], live[2]["rejected"], live[2]["n"], live[2]["bca"]) == (3, 1, 2, 1.0)
    assert live[3]["n"] == 1 and live[3]["bca"] is None  # one class only: no BCA
    pa = tmp_path / "a.jsonl"
    pa.write_text("".join(json.dumps(r) + "\n" for r in a) + '{"t_end": 1')  # a last line still being written
    rep = release_report({"A": pa, "B": b}, folder)
    by = {r["release"]: r for r in rep["releases"]}
    assert sorted(by) == [1, 2, 3] and rep["decoders"]["A"] == {"windows": 7, "cue_locked_versioned": 6}
    assert by[1]["validation"]["bca_mean"] == 0.61 and by[1]["validation"]["version"] == 2
    assert by[2]["validation"]["paired_diff_mean"] == 0.05 and by[2]["live"]["B"]["correct"] == 0
    assert by[3]["rollback_of"] == 1 and by[3]["validation"]["of_release"] == 1  # a rollback: release 1's figures
    assert by[2]["live_pooled"]["n"] == 3 and by[3]["live_pooled"]["bca"] == 1.0
    lines = summary_lines(rep)
    assert len(lines) == 3 and "release 3 (rollback of 1): validation BCA 61.0 %" in lines[2]


def test_report_cli_and_bad_input(folder, tmp_path):
    from neurofed.cli import app

    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps(_win(2, 0, "left_fist", "left_fist")) + "\n" + json.dumps(_win(2, 1, "right_fist", "right_fist")) + "\n")
    out = tmp_path / "r" / "report.json"
    r = CliRunner().invoke(app, ["release", "report", "--store", str(folder), "--predictions", f"S004={p}",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "release 2: validation BCA 66.0 % over 2 client(s), 90 trials; live BCA S004 100.0 % (2 windows)" in r.output
    assert json.loads(out.read_text())["releases"][1]["live"]["S004"]["n"] == 2
    r = CliRunner().invoke(app, ["release", "report", "--store", str(folder), "--predictions", str(p)])
    assert isinstance(r.exception, NeuroFedError) and "use NAME=FILE" in str(r.exception)  # exit 2 via run_cli
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n{}\n")
    with pytest.raises(NeuroFedError, match="bad.jsonl:1: not a JSON line"):
        read_predictions(bad)
