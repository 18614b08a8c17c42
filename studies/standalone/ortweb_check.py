"""onnxruntime-web (WASM, in Node) runs a standalone graph and equals onnxruntime (issue 19: no op it lacks).

Writes real feeds (window 9 of S009's first session after windows 1-8, as the graph's device-profile headset streams
it) and onnxruntime's outputs next to the graph, then runs ``ortweb_check.mjs`` (apps/web's onnxruntime-web;
``npm ci`` in apps/web first) and prints max |dprob| and max |dnext_state| and ms per run.

Usage::

    python studies/standalone/ortweb_check.py DIR/model.lab64.onnx [DIR/model.cyton_daisy16.onnx ...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ab_time import feeds_for


def main() -> None:
    import onnxruntime as ort

    for g in map(Path, sys.argv[1:]):
        f = feeds_for(g, 9)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        probs, nxt, _ = ort.InferenceSession(str(g), so, providers=["CPUExecutionProvider"]).run(None, f)
        with tempfile.TemporaryDirectory() as t:
            d = Path(t)
            f["window"].tofile(d / "window.f32")
            f["state"].tofile(d / "state.f64")
            probs.astype(np.float32).tofile(d / "probs.f32")
            nxt.tofile(d / "next.f64")
            r = subprocess.run(["node", str(Path(__file__).with_suffix(".mjs")), str(g.resolve()), str(d),
                                str(f["window"].shape[0])], capture_output=True, text=True, check=False)
            print(f"{g}: " + (r.stdout.strip() or r.stderr.strip().splitlines()[-1]), flush=True)


if __name__ == "__main__":
    main()
