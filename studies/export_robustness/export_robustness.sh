#!/usr/bin/env bash
# Issue 6 on a real model: train deployment models (FedAvg, SAFE) on the 24 subjects outside fold 0 of the
# published table, export them to ONNX, verify, and evaluate the exported models with onnxruntime on the 6
# held-out subjects (S003 S005 S011 S012 S026 S031): benign, FGSM and PGD-10 at several budgets; torch vs ONNX
# per-subject BCA. Small JSON results go to studies/export_robustness/results/. Usage: bash studies/export_robustness/export_robustness.sh [WORKDIR]
set -euo pipefail
work=${1:-runs/export_robustness}
out=studies/export_robustness/results
held=3,5,11,12,26,31
train=1,2,4,6-10,13-19,24,25,27-30,32,33,42
mkdir -p "$work" "$out"
export OMP_NUM_THREADS=1
for a in fedavg safe; do
  neurofed simulate --algorithm $a --subjects $train --protocol none --test-subjects none --rounds 50 --lr 0.05 \
    --batch-size 8 --seeds 0 --threads 1 --out "$work/$a"
  ckpt="$work/$a/jobs/seed0_fold00.safetensors"
  neurofed export "$ckpt" -o "$work/$a.onnx" --verify-subjects $held --int8 --int8-ops linear --json "$out/$a.export.json"
  python studies/export_robustness/torch_vs_onnx_bca.py "$ckpt" "$work/$a.onnx" $held "$out/$a.torch_vs_onnx.json"
  neurofed evaluate --model "$work/$a.onnx" --subjects $held --json "$out/$a.benign.json"
  neurofed evaluate --model "$work/$a.int8.onnx" --subjects $held --json "$out/$a.int8.benign.json"
  for atk in fgsm pgd; do
    for eps in 0.01 0.03 0.05 0.1; do
      neurofed evaluate --model "$work/$a.onnx" --checkpoint "$ckpt" --subjects $held --attack $atk --eps $eps \
        --json "$out/$a.$atk.$eps.json"
    done
  done
done
