#!/usr/bin/env bash
# Issue 19: the per-profile FLEEG models on a live headset of their profile (docs/BENCHMARKS.md, "Standalone decoder graph"; studies/fleeg).
#
#   studies/fleeg/fleeg_live.sh [WORK]      WORK: scratch folder (default: a fresh mktemp -d)
#
# 1. a small per-profile FLEEG checkpoint: `fleeg` (fleeg_eegnet, local module per profile, standard BN), subjects
#    1-8 split over four profiles (2 each, --profile-seed 0), 3 rounds, no held-out subject (accuracy is not the
#    point: these are latency and parity models), one deployable checkpoint per profile;
# 2. one standalone graph per profile, at the profile's rate and unit (no --rate/--unit);
# 3. parity and per-window cost of each graph (`bench standalone`, held-out S009-S010 as the headset streams them)
#    -> docs/bench/standalone_<profile>.json;
# 4. live latency, each profile's headset-sim stream decoded by edge-client infer choosing from the folder
#    -> docs/bench/e2e_profiles.json (load averages recorded in both).
set -euo pipefail
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-$(mktemp -d)}"
PROFILES="lab64 research21 cyton_daisy16 unicorn8"
export PYTHONPATH="$HERE" NEUROFED_DATA="${NEUROFED_DATA:-$(cd "$HERE/.." && pwd)/shared/data}" OMP_NUM_THREADS=1
cd "$HERE"
nice -n 10 neurofed simulate --algorithm fleeg --model fleeg_eegnet --profiles "${PROFILES// /,}" --subjects 1-8 \
  --test-subjects none --rounds 3 --resample 80 --threads 1 --eval-every 0 --out "$WORK/fleeg_ckpt"
mkdir -p "$WORK/onnx"
for p in $PROFILES; do
  nice -n 10 neurofed export "$WORK/fleeg_ckpt/jobs/seed0_fold00.$p.safetensors" --standalone -o "$WORK/onnx/model.$p.onnx"
done
for p in $PROFILES; do
  nice -n 10 neurofed bench standalone --checkpoint "$WORK/fleeg_ckpt/jobs/seed0_fold00.$p.safetensors" \
    --subjects 9-10 --reps 300 --no-browser --out-dir docs/bench --name "standalone_$p"
done
nice -n 10 neurofed bench e2e --model "$WORK/onnx" --profile "${PROFILES// /,}" --speed 1 --seconds 60 --load 0 \
  --out docs/bench/e2e_profiles.json
