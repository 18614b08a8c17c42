#!/usr/bin/env bash
# The README's test command (and CI's: .ci/run calls this same script).
#
# Installs what the test tiers need and is missing, saying what it installs, then runs every tier:
#   Debian packages  mosquitto (MQTT broker), chromium + chromium-driver (the web app's browser test),
#                    nodejs + npm (the Node app)            -- apt-get, only when a command is missing
#                    rabbitmq-server (tests/broker/test_cluster.py: a 3-node MQTT cluster it starts on loopback;
#                    installed without starting its system service; the test skips if it cannot be installed)
#   a broker         Mosquitto on 127.0.0.1:1883, started when nothing listens there
#   npm packages     apps/web and apps/node, pinned by their package-lock.json (npm ci, when the lock changed)
#   Python packages  this checkout, editable, with the dev/moabb/attacks/grid extras (pip)
# Arguments go to pytest: `bash scripts/test.sh -m unit` runs the unit tier alone (tiers: tests/tiers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1
say() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 2; }

# 1. Debian packages the integration and e2e tiers use.
need=()
command -v mosquitto >/dev/null 2>&1 || need+=(mosquitto mosquitto-clients)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    fail "missing ${need[*]}: install them (Debian: sudo apt-get install ${need[*]}) and run this again"
  fi
  say "installing Debian packages: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing Debian package rabbitmq-server (its system service is not started)"
  made_policy=""  # policy-rc.d exit 101: the package's postinst does not start the service
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1; fi
  { [ ${#need[@]} -gt 0 ] || apt-get update -qq; } && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null \
    || say "rabbitmq-server could not be installed: tests/broker/test_cluster.py will skip"
  [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
fi

# 2. An MQTT broker at 127.0.0.1:1883 (this machine kind starts one; a fresh machine may not).
if ! (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null; then
  say "starting Mosquitto on 127.0.0.1:1883"
  mosquitto -d -c /etc/mosquitto/mosquitto.conf 2>/dev/null || mosquitto -d -p 1883
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null && break; sleep 0.1; done
  (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null || fail "Mosquitto did not start on 127.0.0.1:1883"
fi

# 3. The apps' npm packages (onnxruntime-node's install script would fetch GPU binaries: skipped; the CPU
#    ones ship in the package). Re-installed only when the package-lock changed.
export ONNXRUNTIME_NODE_INSTALL=skip ONNXRUNTIME_NODE_INSTALL_CUDA=skip
for d in apps/web apps/node; do
  stamp="$d/node_modules/.neurofed-lock.sha256"
  want="$(sha256sum "$d/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "npm ci in $d (package-lock.json)"
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" > "$stamp"
  fi
done

# 4. Python: the torch-free runtime (runtime/, not on PyPI: the main package depends on it), then this checkout with
#    the test extras (torch is pinned to the CPU build in pyproject.toml).
say "pip install -e runtime/ && pip install -e '.[dev,moabb,attacks,grid]'"
pip install -q -e runtime/
pip install -q -e '.[dev,moabb,attacks,grid]'

# The core count is read before OMP_NUM_THREADS is set below: GNU nproc honours OMP_NUM_THREADS (it printed 1 there,
# so the suite ran on 2 workers instead of cores + 1).
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
workers="${NEUROFED_TEST_WORKERS:-$(( cores + 1 ))}"

# 5. One torch/OpenMP thread per process: the test workers and the processes they start share the cores, and a
#    second intra-op thread per process mostly waits for a core (measured on 2 cores at load ~2.2: the 4-subject,
#    1-round simulation of tests/trainer/test_sweep.py took 0.4-0.5 s at 1 thread, 1.8-7.1 s at 2).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# 6. Every tier (unit, integration, e2e; tests/tiers.py) on one more pytest-xdist worker than there are cores: over
#    half of the tests' wall time is spent waiting (real-time LSL replays, brokers starting, deadlines), not
#    computing (docs/BENCHMARKS.md "Test suite": 843 CPU-s in 1,918 worker-s), so a spare worker fills them. Tests that
#    stream over LSL run in two xdist groups (tests/tiers.py). `-m unit` etc. select a tier; `-n 0` runs in this process.
exec python -m pytest -n "$workers" --dist loadgroup "$@"
