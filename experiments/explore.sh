#!/usr/bin/env bash
# Exploration of the local-step budget (issue 3's "known gap"): one seed, subject 5-fold, EEGMMIDB 30 subjects.
# Usage: bash experiments/explore.sh QUEUE   (QUEUE = a or b; two queues run in parallel, one thread each)
set -u
common="--subjects all --protocol kfold:5 --rounds 100 --seeds 0 --channels sensorimotor21 --resample 80 --eval-every 10"
run() { name=$1; shift; [ -f runs/explore/$name/results.json ] && return; OMP_NUM_THREADS=1 neurofed simulate $common "$@" --out runs/explore/$name > runs/explore/$name.log 2>&1; }
mkdir -p runs/explore
case "$1" in
a)
  run ct_b64 --algorithm ct --ct-batch-size 64
  run fedavg_b32_e2 --algorithm fedavg --batch-size 32 --local-epochs 2
  run fedavg_b8_e2 --algorithm fedavg --batch-size 8 --local-epochs 2
  run fedavg_b8_e2_lr02 --algorithm fedavg --batch-size 8 --local-epochs 2 --lr 0.02
  ;;
b)
  run fedbs_b32_e2 --algorithm fedbs --batch-size 32 --local-epochs 2
  run fedbs_b8_e2 --algorithm fedbs --batch-size 8 --local-epochs 2
  run fedbn_b8_e2 --algorithm fedbn --batch-size 8 --local-epochs 2
  run fedbs_b8_e5 --algorithm fedbs --batch-size 8 --local-epochs 5
  ;;
esac
