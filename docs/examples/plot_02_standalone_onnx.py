"""
Export the standalone ONNX decoder and decode raw windows
=========================================================

The model trained in the previous example becomes one ``.onnx`` graph that an app runs on raw device
windows: channel selection, band-pass, resampling, Euclidean alignment, batch-specific BatchNorm and an
input guard are all inside the graph, and what they need from the past travels in a ``state`` vector.
Here onnxruntime decodes held-out subject 4's real recordings, cue by cue, in time order, as an app would.
No torch is needed at this point (:class:`neurofed.export.decoder.StandaloneModel` is the runtime layer).
"""

# %%
# The checkpoint
# --------------
# The same configuration into the same directory: the previous example's run is reused (a stand-alone run
# of this script trains it first, about a minute).
import json
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from neurofed.export.decoder import StandaloneModel
from neurofed.export.standalone import eegmmidb_session_windows, export_standalone
from neurofed.trainer.experiments.simulate import run_simulation
from neurofed.trainer.experiments.spec import parse_line

torch.set_num_threads(1)
OPTIONS = "--algorithm fedbs --subjects 1-4 --folds 3 --rounds 2 --fraction 1 --eval-every 1 --save-models"
runs = Path(os.environ.get("NEUROFED_DOCS_RUNS") or tempfile.mkdtemp(prefix="neurofed-docs-"))
results = run_simulation(parse_line(OPTIONS).to_sim_config(), runs / "federate-1-4", threads=1)
checkpoint = runs / "federate-1-4" / "jobs" / "seed0_fold03.safetensors"
print(checkpoint.name, f"{checkpoint.stat().st_size / 1024:.0f} kB")

# %%
# Export
# ------
# ``neurofed export CHECKPOINT --standalone --out model.onnx`` does the same. The device defaults to
# EEGMMIDB's: 160 Hz, microvolts. The model card (the ONNX metadata contract) is embedded in the graph.
onnx_path = runs / "model.onnx"
meta, _ = export_standalone(checkpoint, onnx_path)
print(f"{onnx_path.name}: {onnx_path.stat().st_size / 1024:.0f} kB, model hash {meta.model_hash[:12]}...")
info = meta.standalone
print(json.dumps({k: info[k] for k in ("rate", "unit", "window_samples", "step_s", "state_size")}, indent=1))
print("channels:", ", ".join(meta.ch_names))
print("classes:", meta.classes)

# %%
# Decode a held-out subject's sessions
# ------------------------------------
# One raw window per cue (4 s at 160 Hz, the channels in the model's order), each session from the
# initial state: the first windows of a session calibrate the alignment, as on a new headset.
model = StandaloneModel(onnx_path)
sessions = eegmmidb_session_windows(4, list(meta.ch_names), list(meta.classes), *meta.window)
truth, probs = [], []
for run_file, windows, labels, rate in sessions:
    state = model.initial_state()
    for window, label in zip(windows, labels):
        p, state = model.run(window, state)
        probs.append(p.ravel())
        truth.append(label)
    print(f"{run_file}: {len(windows)} windows at {rate:g} Hz")
probs, truth = np.array(probs), np.array(truth)
pred = probs.argmax(1)
bca = np.mean([np.mean(pred[truth == c] == c) for c in range(len(meta.classes))])
print(f"subject 4, onnxruntime on raw windows: BCA {100 * bca:.1f} % over {len(truth)} cues")

# %%
# The simulation aligned subject 4 with the mean covariance of all 45 of its trials at once; the graph
# aligns each session from the running covariance of the windows it has seen so far, so the first windows
# of a session are decoded with a young reference (docs/apps.md, "Calibration"), and the two scores differ.
print(f"simulation (previous example): BCA {100 * results['per_subject']['S004']['bca']:.1f} %")

# %%
# The probability of "right fist" for every cue, coloured by what the subject imagined. After two
# rounds of training on three subjects the classes overlap; the studies train for 100 rounds on 45.
fig, ax = plt.subplots(figsize=(6, 3))
for c, name in enumerate(meta.classes):
    idx = np.flatnonzero(truth == c)
    ax.scatter(idx, probs[idx, 1], s=12, label=name)
ax.axhline(0.5, color="grey", ls="--")
ax.set(xlabel="cue (time order)", ylabel=f"p({meta.classes[1]})", ylim=(0, 1))
ax.legend(loc="upper right", fontsize=8)
fig.tight_layout()
