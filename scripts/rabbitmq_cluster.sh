#!/usr/bin/env bash
# A three-node RabbitMQ cluster with the MQTT plugin, on loopback, in a directory of its own (issue 54).
#
#   bash scripts/rabbitmq_cluster.sh start [DIR]   start it; prints DIR=..., MQTT_URLS=..., START_SECONDS=...
#   bash scripts/rabbitmq_cluster.sh status DIR    the cluster's members and each node's MQTT listener
#   bash scripts/rabbitmq_cluster.sh stop DIR      stop the nodes and the epmd this script started; remove DIR
#   bash scripts/rabbitmq_cluster.sh ctl DIR ARGS  rabbitmqctl ARGS against node 1 (e.g. add_user, set_topic_permissions)
#
# Uses the distribution's rabbitmq-server (Debian: apt-get install rabbitmq-server; RabbitMQ 3.10, Erlang 25).
# Everything is private to DIR (default: a new /tmp/neurofed-rmq.XXXXXX): node names rabbit1..N@localhost, their
# Mnesia and log directories, the enabled-plugins file, the Erlang cookie (HOME=DIR/home), and an epmd of our
# own on its own port, so a system RabbitMQ (rabbit@localhost, epmd on 4369, AMQP 5672) is never touched. Every
# port is on 127.0.0.1. Run as root, the nodes run as the unprivileged `rabbitmq` user (setpriv); otherwise as
# the calling user. The nodes are started in parallel; nodes 2..N then `rabbitmqctl join_cluster` node 1.
#
# Settings (environment):
#   RMQ_NODES       number of nodes (default 3)
#   RMQ_BASE_PORT   ports: MQTT base+i, AMQP base+10+i, Erlang distribution base+20+i (node i = 1..N), epmd
#                   base+30, CLI distribution base+40..base+49 (default 41880; every one must be free)
#   RMQ_KEEP=1      stop: keep DIR (logs) instead of removing it
set -euo pipefail

RMQ_LIB=${RMQ_LIB:-/usr/lib/rabbitmq/bin}  # the unwrapped scripts (/usr/sbin's wrapper su's to rabbitmq, cds to /var/lib)
NODES=${RMQ_NODES:-3}
BASE=${RMQ_BASE_PORT:-41880}
say() { printf '%s\n' "$*"; }
STARTING=""  # set while `start` runs: a failed start stops what it started (keeping the logs)
fail() {
  printf 'rabbitmq_cluster: %s\n' "$*" >&2
  if [ -n "$STARTING" ]; then local d=$STARTING; STARTING=""; RMQ_KEEP=1 stop "$d" >&2 || true; fi
  exit 2
}

[ -x "$RMQ_LIB/rabbitmq-server" ] || fail "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"

# --- who runs the nodes: never root
RUN=()
if [ "$(id -u)" -eq 0 ]; then
  id rabbitmq >/dev/null 2>&1 || fail "running as root and there is no 'rabbitmq' user to run the nodes as"
  RUN=(setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups --)
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- the environment of node $1 (or of the CLI tools when $1 is 0) in DIR $2
node_env() {
  local i=$1 dir=$2
  export HOME="$dir/home" ERL_EPMD_PORT=$((BASE + 30)) ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_USE_LONGNAME=false RABBITMQ_CTL_DIST_PORT_MIN=$((BASE + 40)) RABBITMQ_CTL_DIST_PORT_MAX=$((BASE + 49))
  unset ERL_FLAGS RABBITMQ_NODENAME
  if [ "$i" -gt 0 ]; then
    local nd="$dir/rabbit$i"
    export RABBITMQ_NODENAME="rabbit$i@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT=$((BASE + 10 + i)) RABBITMQ_DIST_PORT=$((BASE + 20 + i)) \
      RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$nd/advanced.config" \
      RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd/log" RABBITMQ_PID_FILE="$nd/pid" \
      RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  fi
}

ctl() {  # ctl DIR NODE_INDEX ARGS...: rabbitmqctl against node i of DIR
  local dir=$1 i=$2
  shift 2
  (node_env 0 "$dir" && "${RUN[@]}" "$RMQ_LIB/rabbitmqctl" -q -n "rabbit$i@localhost" "$@")
}

load_settings() {  # the ports and node count DIR was started with
  [ -f "$1/cluster.env" ] || fail "$1 is not a cluster directory of this script (no cluster.env)"
  # shellcheck disable=SC1091
  . "$1/cluster.env"
  NODES=$RMQ_NODES BASE=$RMQ_BASE_PORT
}

start() {
  local dir=${1:-}
  local t0
  t0=$(date +%s%N)
  local made=""
  if [ -z "$dir" ]; then dir=$(mktemp -d /tmp/neurofed-rmq.XXXXXX); made=1; else mkdir -p "$dir"; fi
  dir=$(cd "$dir" && pwd)
  # never disturb anything already there: every port of ours must be free
  local p
  for p in $(seq $((BASE + 1)) $((BASE + NODES))) $(seq $((BASE + 11)) $((BASE + 10 + NODES))) \
           $(seq $((BASE + 21)) $((BASE + 20 + NODES))) $((BASE + 30)) $(seq $((BASE + 40)) $((BASE + 49))); do
    port_free "$p" || { [ -z "$made" ] || rmdir "$dir"; fail "port 127.0.0.1:$p is in use (set RMQ_BASE_PORT to another range)"; }
  done
  if ! port_free 4369 || ! port_free 5672; then  # e.g. the distribution's service: rabbit@localhost
    say "note: a RabbitMQ / epmd already runs on this machine (4369 or 5672 in use); it is left alone: this cluster" \
        "has its own node names, ports, epmd and Erlang cookie" >&2
  fi
  STARTING=$dir
  mkdir -p "$dir/home"
  printf 'RMQ_NODES=%s\nRMQ_BASE_PORT=%s\n' "$NODES" "$BASE" > "$dir/cluster.env"
  : > "$dir/rabbitmq-env.conf"
  echo '[rabbitmq_mqtt].' > "$dir/enabled_plugins"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/home/.erlang.cookie"
  chmod 400 "$dir/home/.erlang.cookie"
  local i
  for i in $(seq "$NODES"); do
    mkdir -p "$dir/rabbit$i/log" "$dir/rabbit$i/mnesia"
    cat > "$dir/rabbit$i/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((BASE + 10 + i))
mqtt.listeners.tcp.default = 127.0.0.1:$((BASE + i))
mqtt.allow_anonymous = true
mqtt.vhost = /
mqtt.exchange = amq.topic
log.console = false
log.file.level = warning
EOF
  done
  [ ${#RUN[@]} -eq 0 ] || chown -R rabbitmq:rabbitmq "$dir"
  chmod 700 "$dir"
  # our own epmd (the distribution's name server) on our own port: the nodes and rabbitmqctl find it by ERL_EPMD_PORT
  (node_env 0 "$dir" && exec "${RUN[@]}" epmd -port $((BASE + 30)) -address 127.0.0.1) >"$dir/epmd.log" 2>&1 &
  echo $! > "$dir/epmd.pid"
  for _ in $(seq 50); do port_free $((BASE + 30)) || break; sleep 0.1; done
  for i in $(seq "$NODES"); do
    (node_env "$i" "$dir" && exec "${RUN[@]}" "$RMQ_LIB/rabbitmq-server") >"$dir/rabbit$i/stdout.log" 2>&1 &
    echo $! > "$dir/rabbit$i/beam.pid"
  done
  for i in $(seq "$NODES"); do  # `wait` waits for the node's pid file, then for the node to boot
    ctl "$dir" "$i" wait --timeout 120 "$dir/rabbit$i/pid" >/dev/null 2>&1 \
      || fail "node rabbit$i@localhost did not start; see $dir/rabbit$i/log and $dir/rabbit$i/stdout.log"
  done
  for i in $(seq 2 "$NODES"); do
    ctl "$dir" "$i" stop_app >/dev/null
    ctl "$dir" "$i" join_cluster rabbit1@localhost >/dev/null || fail "rabbit$i@localhost could not join rabbit1@localhost"
    ctl "$dir" "$i" start_app >/dev/null
  done
  for i in $(seq "$NODES"); do
    ctl "$dir" "$i" await_startup --timeout 120 >/dev/null 2>&1 || fail "node rabbit$i@localhost did not come back"
  done
  local urls=()
  for i in $(seq "$NODES"); do urls+=("mqtt://127.0.0.1:$((BASE + i))"); done
  for i in $(seq "$NODES"); do
    for _ in $(seq 100); do port_free $((BASE + i)) || break; sleep 0.1; done
    port_free $((BASE + i)) && fail "node rabbit$i@localhost: no MQTT listener on 127.0.0.1:$((BASE + i))"
  done
  STARTING=""
  say "DIR=$dir"
  say "MQTT_URLS=${urls[*]}"
  local ms=$((($(date +%s%N) - t0) / 1000000))
  say "START_SECONDS=$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
}

status() {
  local dir=${1:?usage: status DIR}
  load_settings "$dir"
  ctl "$dir" 1 cluster_status
  local i
  for i in $(seq "$NODES"); do
    if port_free $((BASE + i)); then say "rabbit$i@localhost: MQTT 127.0.0.1:$((BASE + i)) down"
    else say "rabbit$i@localhost: MQTT 127.0.0.1:$((BASE + i)) up"; fi
  done
}

stop() {
  local dir=${1:?usage: stop DIR}
  load_settings "$dir"
  local i pid
  for i in $(seq "$NODES" -1 1); do  # the last joined first; node 1 (the seed) last
    ctl "$dir" "$i" shutdown >/dev/null 2>&1 || true
  done
  for f in "$dir"/rabbit*/pid "$dir"/rabbit*/beam.pid "$dir/epmd.pid"; do  # only processes this script started, by id
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  if [ "${RMQ_KEEP:-0}" = 1 ]; then say "stopped; kept $dir"; else rm -rf "$dir"; say "stopped; removed $dir"; fi
}

case "${1:-}" in
  start) start "${2:-}" ;;
  status) status "${2:-}" ;;
  stop) stop "${2:-}" ;;
  ctl) d=${2:?usage: ctl DIR ARGS...}; shift 2; load_settings "$d"; ctl "$d" 1 "$@" ;;
  *) fail "usage: $0 start [DIR] | status DIR | stop DIR | ctl DIR ARGS..." ;;
esac
