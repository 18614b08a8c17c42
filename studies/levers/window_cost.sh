#!/usr/bin/env bash
# Per-window cost of the standalone graph (issue 57: a deployable model is one graph at <= 1 ms per window) for the
# architectures and inputs the levers study measures: EEGNet on 21 channels (today's), EEG-ITNet on 21 channels and
# EEGNet on all 64. The cost does not depend on the weights, so each graph is exported from a 1-round model of
# S001-S002; studies/standalone/cost.py counts callgrind instructions per call (load-independent) and times calls.
# Writes studies/levers/window_cost.json. Run from the repository root (~3 minutes).
set -euo pipefail
export OMP_NUM_THREADS=1
T="$(mktemp -d)"
for spec in "eegnet sensorimotor21" "itnet sensorimotor21" "eegnet all"; do
  set -- $spec
  neurofed simulate --algorithm safe --model "$1" --channels "$2" --subjects 1-2 --test-subjects none --rounds 1 \
    --out "$T/$1_$2" >/dev/null
  neurofed export "$T/$1_$2/jobs/seed0_fold00.safetensors" --standalone -o "$T/$1_$2.onnx" >/dev/null
done
python studies/standalone/cost.py "$T/eegnet_sensorimotor21.onnx" "$T/itnet_sensorimotor21.onnx" "$T/eegnet_all.onnx" \
  --subject 13 --out studies/levers/window_cost.json
