"""Is ``on_context`` (decode_stream, bn="context", online EA) the standalone ONNX graph's decoder?

Run: python studies/tta/graph_parity.py runs/tta_fedbs/jobs/seed0_fold00.safetensors [--out studies/tta/graph_parity.json]
Exports the checkpoint as a standalone graph (160 Hz, uV, in a temporary folder), streams each held-out subject's
raw windows of runs 4, 8, 12 through it with ONE state (the study's session: all 45 windows in recorded order), and
compares the probabilities with ``decode_stream`` on the preprocessed windows (EA online, context of 8).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import eegmmidb_session_windows, export_standalone
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import load_subjects
from neurofed.trainer.tta import TTAConfig, decode_stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model, meta = load_checkpoint(args.checkpoint)
    job = json.loads(args.checkpoint.with_suffix(".json").read_text())
    pre = replace(PreprocessConfig.from_dict(meta.preprocess), ea=False)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        sa = Path(tmp) / "m.standalone.onnx"
        export_standalone(args.checkpoint, sa)
        sm = StandaloneModel(sa, threads=1)
        for name in job["test_subjects"]:
            s = int(name[1:])
            sessions = eegmmidb_session_windows(s, list(sm.meta.ch_names), list(sm.meta.classes), *sm.meta.window)
            state, graph = sm.initial_state(), []
            for _, windows, _, _ in sessions:
                for w in windows:
                    p, state = sm.run(w.astype(np.float32), state)
                    graph.append(p)
            sd = load_subjects([s], pre)[0]
            ours = decode_stream(model, sd.X, TTAConfig(bn="context"), ea_online=True).probs
            g = np.stack(graph)
            rows[name] = {"windows": len(g), "max_abs_prob_diff": float(np.abs(g - ours).max()),
                          "class_mismatches": int((g.argmax(1) != ours.argmax(1)).sum())}
            print(name, rows[name])
    out = {"checkpoint": str(args.checkpoint), "subjects": rows,
           "max_abs_prob_diff": max(r["max_abs_prob_diff"] for r in rows.values()),
           "class_mismatches": sum(r["class_mismatches"] for r in rows.values())}
    print({k: out[k] for k in ("max_abs_prob_diff", "class_mismatches")})
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
