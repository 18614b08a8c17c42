#!/usr/bin/env bash
# Run the experiments listed in a spec file, one after another. Each run resumes its directory: finished
# (seed, fold) jobs are kept, so a finished run only re-summarises and a run given more --seeds adds them. Results (small JSON) go to experiments/results/<group>/<name>/.
# Superseded by `neurofed grid SPEC` (one Ray task per (run, seed, fold), tracebacks of failed jobs; docs/BENCHMARKS.md).
# Usage: bash experiments/queue.sh experiments/<spec>.txt [group]   (group: results folder, default the spec name)
# Spec lines: NAME  <neurofed simulate options>     (# comments allowed)
set -u
spec=$1
group=${2:-$(basename "$spec" .txt)}
mkdir -p "experiments/results/$group"
while read -r name opts; do
  case "$name" in ''|\#*) continue;; esac
  out="experiments/results/$group/$name"
  echo "$(date -u +%H:%M:%S) start $name"
  OMP_NUM_THREADS=1 python -m neurofed.trainer.cli simulate $opts --workers 1 --threads 1 --out "$out" >> "$out.log" 2>&1
  rc=$?  # (it used to echo "rc=$?" after $(date ...), i.e. date's status: rc=0 even for failed runs)
  echo "$(date -u +%H:%M:%S) end $name rc=$rc"
done < "$spec"
