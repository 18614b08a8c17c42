"""Live accuracy of each release beside its federated validation (issue 55): ``neurofed release report``.

A decoder following releases (``edge-client infer --follow --mode cue --predictions-out FILE``) writes one JSON line
per cue-locked window: the release version that decoded it (``model_version``), the predicted class (``label``) and
the cue the session asked for (``cue``, with its stream time ``onset``). In a cued session the cue is the true class,
so each release's **live BCA** is the balanced accuracy of the windows it decoded against their cues
(:func:`live_by_release`). :func:`release_report` puts it beside what the release gate measured before the release
(the validating clients' mean BCA, ``history.json`` of the release folder) and the signed header (parent, rollback
of), per release version; a rollback carries the validation figures of the release whose model it republishes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neurofed.broker.release_gate import read_history
from neurofed.broker.releases import ReleaseStore
from neurofed.trainer.errors import NeuroFedError

__all__ = ["live_by_release", "read_predictions", "release_report"]

#: the gate's figures copied into the report for each release
VALIDATION_KEYS = ("version", "n_clients", "n_trials", "bca_mean", "bca_weighted", "release_bca_mean",
                   "paired_diff_mean", "paired_diff_se", "decided_at")


def read_predictions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The decoded windows a decoder wrote with ``--predictions-out`` (one JSON object per line; a line cut short
    by a decoder still writing it is ignored only if it is the last)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise NeuroFedError(f"{p}: cannot read predictions ({exc.strerror})") from None
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise NeuroFedError(f"{p}:{i + 1}: not a JSON line of decoded windows") from None
        if not isinstance(row, dict):
            raise NeuroFedError(f"{p}:{i + 1}: not a JSON object")
        out.append(row)
    return out


def _cued(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The cue-locked windows a following decoder decoded (with a cue onset and a release version)."""
    return [r for r in rows if r.get("onset") is not None and r.get("model_version") is not None]


def _scored(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(cue, predicted) class indices of the windows that were decoded (not rejected) with a cue and label in
    ``names``."""
    ok = [r for r in rows if "rejected" not in r and r.get("cue") in names and r.get("label") in names]
    return (np.array([names.index(r["cue"]) for r in ok], int), np.array([names.index(r["label"]) for r in ok], int))


def live_by_release(predictions: Sequence[Mapping[str, Any]], classes: Sequence[str] | None = None
                    ) -> dict[int, dict[str, Any]]:
    """Per release version, the cue-locked windows it decoded: counts, rejections and the BCA (with accuracy, its
    95 % Wilson interval and the p-value against chance, :func:`neurofed.demo_eval.decoded`) of its predictions
    against their cues. Windows without a cue (sliding mode) or without a version (not following) are left out;
    ``classes`` default to every cue and predicted label seen, sorted."""
    from neurofed.demo_eval import decoded  # lazy: scipy

    cued = _cued(predictions)
    names = list(classes) if classes is not None else sorted(
        {str(r["cue"]) for r in cued} | {str(r["label"]) for r in cued if "label" in r})
    out: dict[int, dict[str, Any]] = {}
    for v in sorted({int(r["model_version"]) for r in cued}):
        rows = [r for r in cued if int(r["model_version"]) == v]
        y, p = _scored(rows, names)
        out[v] = {"windows": len(rows), "rejected": sum("rejected" in r for r in rows),
                  "first_onset": min(float(r["onset"]) for r in rows), **decoded(y, p)}
    return out


def release_report(predictions: Mapping[str, str | os.PathLike | Sequence[Mapping[str, Any]]],
                   store: str | os.PathLike) -> dict[str, Any]:
    """Each release of ``store`` (a coordinator's release folder, or a publisher's ``--store``) with its signed
    header, the release gate's validation figures and the live BCA of every decoder in ``predictions`` (name ->
    ``--predictions-out`` file or its rows), and pooled over the decoders."""
    from neurofed.demo_eval import decoded  # lazy: scipy

    store = Path(store)
    gate = {h["release"]: h for h in read_history(store) if h.get("released")}
    signed = {h["version"]: h for h in ReleaseStore(store).history()}
    rows = {name: (read_predictions(src) if isinstance(src, (str, os.PathLike)) else list(src))
            for name, src in predictions.items()}
    cued = {name: _cued(rs) for name, rs in rows.items()}
    classes = sorted({str(r["cue"]) for rs in cued.values() for r in rs})
    live = {name: live_by_release(rs, classes or None) for name, rs in rows.items()}
    versions = sorted(set(gate) | set(signed) | {v for per in live.values() for v in per})
    releases = []
    for v in versions:
        h = signed.get(v, {})
        source = h.get("rollback_of") or v  # a rollback runs the model of the release it names
        g = gate.get(source)
        per = {name: per_v[v] for name, per_v in live.items() if v in per_v}
        ys, ps = _scored([r for rs in cued.values() for r in rs if int(r["model_version"]) == v], classes)
        releases.append({
            "release": v, "parent": h.get("parent"), "rollback_of": h.get("rollback_of"),
            "signed": bool(h), "sha256": h.get("sha256"),
            "validation": ({k: g.get(k) for k in VALIDATION_KEYS} | {"of_release": source}) if g else None,
            "live": per, "live_pooled": decoded(ys, ps),
        })
    return {"store": str(store), "classes": classes,
            "decoders": {name: {"windows": len(rs), "cue_locked_versioned": len(cued[name])}
                         for name, rs in rows.items()},
            "releases": releases}


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per release: validation BCA beside each decoder's live BCA."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f} %"

    lines = []
    for r in report["releases"]:
        val = r["validation"]
        head = f"release {r['release']}" + (f" (rollback of {r['rollback_of']})" if r["rollback_of"] else "")
        vtxt = (f"validation BCA {pct(val['bca_mean'])} over {val['n_clients']} client(s), {val['n_trials']} trials"
                if val else "no validation record")
        ltxt = "; ".join(f"{n} {pct(s['bca'])} ({s['n']} windows)" for n, s in r["live"].items()) or "no live window"
        lines.append(f"{head}: {vtxt}; live BCA {ltxt}; pooled {pct(r['live_pooled']['bca'])} "
                     f"({r['live_pooled']['n']} windows)")
    return lines
