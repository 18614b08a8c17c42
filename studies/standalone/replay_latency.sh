#!/usr/bin/env bash
# The decoder's own latency when a recording is replayed 10x faster than real time (issue 16 item 4).
#
#   studies/standalone/replay_latency.sh [SRC]      SRC: a source tree to run (default: this checkout)
#
# Old behaviour, for comparison (the commit before the change):
#   mkdir -p /tmp/old && git archive 8e8bf6f | tar -x -C /tmp/old && studies/standalone/replay_latency.sh /tmp/old
#
# Exports a random-init EEGNet (demo layout; latency does not depend on weights), then in a private LSL
# session `headset-sim` replays S003 run 4 at 10x while `edge-client infer --mode cue` decodes its 15 cues;
# prints the decoder's final `done: {...}` line (latency_ms_* = emission - arrival of each window's last
# sample; before the change: LSL clock at emission - the replayed stream's own stamp, hence negative).
set -euo pipefail
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="$(cd "${1:-$HERE}" && pwd)"
export NEUROFED_DATA="${NEUROFED_DATA:-$(cd "$HERE/.." && pwd)/shared/data}" OMP_NUM_THREADS=1
TMP="$(mktemp -d)"
PYTHONPATH="$HERE" python -c "
from pathlib import Path; from neurofed.bench_e2e import build_latency_model
build_latency_model(Path('$TMP/lat.onnx'), 3, None)" >/dev/null
export LSLAPICFG="$(PYTHONPATH="$HERE" python -c "
from neurofed.edge.lsl_config import use_private_session; print(use_private_session('replay-latency', '$TMP')[1])")"
export PYTHONPATH="$SRC"
NAME="replay-$RANDOM"
python -c "import sys; sys.argv[0]='edge-client'; from neurofed.edge.cli import main; main()" infer \
  --model "$TMP/lat.onnx" --stream "$NAME" --mode cue --quiet --timeout 60 --duration 30 >"$TMP/infer.log" 2>&1 &
INFER=$!
python -c "import sys; sys.argv[0]='headset-sim'; from neurofed.firmware_sim.cli import main; main()" \
  --subject 3 --runs 4 --speed 10 --name "$NAME" --wait-consumers 60 >"$TMP/sim.log" 2>&1
wait "$INFER"
grep -A3 "^done:" "$TMP/infer.log" || { echo "no result; end of the decoder log:"; tail -5 "$TMP/infer.log"; exit 1; }
