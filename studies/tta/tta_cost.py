"""Cost of the torch-side stream decoders per window (issue 57's budget: <= 1 ms per window for the graph).

Run: python studies/tta/tta_cost.py runs/tta_fedbs/jobs/seed0_fold00.safetensors [--out studies/tta/cost.json]
Decodes the first held-out subject of the checkpoint's job (online EA) under each condition, 3 repetitions, one
thread, and reports the median wall time per window. This is eager PyTorch in Python (what an edge client with torch
would run), not the standalone ONNX graph.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import load_subjects
from neurofed.trainer.tta import TTAConfig, decode_stream

CONDS = {
    "context": TTAConfig(bn="context"),
    "adabn": TTAConfig(),
    "tent": TTAConfig(entropy=True),
    "tent_every_window": TTAConfig(entropy=True, max_entropy=1.0),  # a step after every window: the worst case
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, meta = load_checkpoint(args.checkpoint)
    job = json.loads(args.checkpoint.with_suffix(".json").read_text())
    pre = replace(PreprocessConfig.from_dict(meta.preprocess), ea=False)
    sd = load_subjects([int(job["test_subjects"][0][1:])], pre)[0]
    out = {"checkpoint": str(args.checkpoint), "subject": sd.subject, "windows": len(sd.X),
           "load_1min": os.getloadavg()[0], "ms_per_window": {}, "steps": {}}
    for name, cfg in CONDS.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            r = decode_stream(model, sd.X, cfg, ea_online=True)
            times.append((time.perf_counter() - t0) / len(sd.X) * 1e3)
        out["ms_per_window"][name] = float(np.median(times))
        out["steps"][name] = r.updates
        out.setdefault("configs", {})[name] = asdict(cfg)
        print(f"{name:18s} {np.median(times):.2f} ms/window  ({r.updates} SGD steps)")
    print(f"load (1 min) {out['load_1min']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
