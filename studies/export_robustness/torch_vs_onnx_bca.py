"""Per-subject BCA of a checkpoint in torch vs its ONNX export in onnxruntime (fp32 must agree exactly).

Usage: python studies/export_robustness/torch_vs_onnx_bca.py CHECKPOINT MODEL.onnx SUBJECTS OUT.json   (SUBJECTS like 1-9)
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from neurofed.export.runtime import OnnxModel
from neurofed.trainer.checkpoint import load_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.eegmmidb import parse_subjects
from neurofed.trainer.evaluate import bca, predict

torch.set_num_threads(1)
ckpt, onnx_path, subjects, out = sys.argv[1:5]
model, meta = load_checkpoint(ckpt)
ort_model = OnnxModel(onnx_path)
cfg = PreprocessConfig.from_dict(meta.preprocess)
rows = {}
for s in parse_subjects(subjects, None):
    sd = load_eegmmidb_subject(s, cfg)
    p_t = predict(model, sd.X, meta.test_batch_size)
    p_o = ort_model.predict(sd.X, meta.test_batch_size)
    rows[sd.subject] = {"bca_torch": bca(sd.y, p_t), "bca_onnx": bca(sd.y, p_o), "same_predictions": float(np.mean(p_t == p_o))}
    print(sd.subject, rows[sd.subject])
diff = max(abs(r["bca_torch"] - r["bca_onnx"]) for r in rows.values())
res = {"command": "python studies/export_robustness/torch_vs_onnx_bca.py " + " ".join(sys.argv[1:5]), "per_subject": rows,
       "max_abs_bca_difference": diff}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("max |BCA torch - BCA onnx| =", diff)
