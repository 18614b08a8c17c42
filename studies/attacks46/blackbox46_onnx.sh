#!/usr/bin/env bash
# Issue 21, black-box targets on all 46 shared subjects, through the product path: each fold's saved model
# (studies/attacks46/spec.toml, --save-models) is exported to ONNX and `neurofed evaluate` runs ART's Square attack
# (1000 queries per test batch of 8, eps x each trial's channel std) against the exported graph itself through
# onnxruntime — what an attacker holding the app's model file can do; no gradients, no checkpoint. onnxruntime
# queries are ~2x faster than torch's and find the same adversarial trials (tests/export/test_evaluate.py).
# Seed 0 unless SEEDS="0 1 2". Resumable: a fold whose JSON exists is skipped. Two folds at a time (one thread each; JOBS=N for N).
#   neurofed grid studies/attacks46/spec.toml --backend pool --workers 2      (the models; seed 0)
# Models are not kept in git: on a fresh checkout, train a committed seed again and get its models placed beside the
# committed jobs when (and only when) each re-trained job equals the committed one subject by subject:
#   neurofed grid studies/attacks46/spec.toml --reproduce --seeds 1 --backend pool --workers 2
#   bash studies/attacks46/blackbox46_onnx.sh safe fedavg                          (then this; minutes to ~half an hour per fold)
#   python studies/attacks46/blackbox46_table.py                                   (table, retention, paired tests)
# A RUN is a folder under runs/studies/results/blackbox46 or (with a "/") any run folder trained with --save-models:
#   bash studies/attacks46/blackbox46_onnx.sh runs/studies/results/baselines46/ct_at
set -euo pipefail
RES=runs/studies/results/blackbox46
ATTACK=${ATTACK:-square}
EPS=${EPS:-0.05}
export OMP_NUM_THREADS=1 NEUROFED_DATA=${NEUROFED_DATA:-../shared/data/eegmmidb}
one() {  # RUN JOB.json
  local run=$1 job=$2 name out onnx subjects seed
  name=$(basename "$job" .json)
  out=$run/onnx_attack/${ATTACK}_${EPS}/$name.json
  [ -f "$out" ] && return 0
  onnx=$run/onnx/$name.onnx
  mkdir -p "$(dirname "$out")" "$(dirname "$onnx")"
  [ -f "$onnx" ] || neurofed export "${job%.json}.safetensors" -o "$onnx" --no-verify > /dev/null
  subjects=$(python -c "import json,sys; print(','.join(str(int(s[1:])) for s in json.load(open(sys.argv[1]))['test_subjects']))" "$job")
  seed=${name#seed}; seed=${seed%%_*}  # the attack's random draws use the training job's seed (as `neurofed sweep` does)
  neurofed evaluate --model "$onnx" --subjects "$subjects" --attack "$ATTACK" --eps "$EPS" --seed "$seed" \
    --json "$out.part" > /dev/null && mv "$out.part" "$out" && echo "$(date +%T) $run $name done"
}
export -f one
export RES ATTACK EPS
for run in "$@"; do
  case $run in */*) ;; *) run=$RES/$run ;; esac
  for seed in ${SEEDS:-0}; do
    for job in "$run"/jobs/seed${seed}_fold0*.json; do
      [ -f "${job%.json}.safetensors" ] && echo "$run $job"
    done
  done
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'one "$0" "$1"'
