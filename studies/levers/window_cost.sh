#!/usr/bin/env bash
# Per-window cost of the standalone graph (issue 57: a deployable model is one graph at <= 1 ms per window) for the
# architectures and inputs the levers study measures: EEGNet on 21 channels at 80 Hz (today's), cropped EEGNet
# (eegnet_crop), EEG-ITNet on 21 channels, EEGNet on all 64 channels, and EEGNet on 21 channels at 160 Hz (the
# recording's rate: --resample 0). The cost does not depend on the weights, so each graph is exported from a 1-round
# model of S001-S002; studies/standalone/cost.py counts callgrind instructions per call (load-independent) and times
# calls. Writes studies/levers/window_cost.json. Run from the repository root (~4 minutes).
set -euo pipefail
export OMP_NUM_THREADS=1
T="$(mktemp -d)"
graphs=()
for spec in "eegnet sensorimotor21 80" "eegnet_crop sensorimotor21 80" "itnet sensorimotor21 80" "eegnet all 80" \
            "eegnet sensorimotor21 0"; do
  set -- $spec
  name="$1_$2"; [ "$3" = 80 ] || name="$1_$2_160hz"
  neurofed simulate --algorithm safe --model "$1" --channels "$2" --resample "$3" --subjects 1-2 --test-subjects none \
    --rounds 1 --out "$T/$name" >/dev/null
  neurofed export "$T/$name/jobs/seed0_fold00.safetensors" --standalone -o "$T/$name.onnx" >/dev/null
  graphs+=("$T/$name.onnx")
done
python studies/standalone/cost.py "${graphs[@]}" --subject 13 --root "$T" --out studies/levers/window_cost.json
