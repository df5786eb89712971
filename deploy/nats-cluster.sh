#!/usr/bin/env bash
# A 3-node NATS cluster with JetStream on loopback, for trying Halyard's broker fault
# tolerance on one machine (each node: own store and log in a temporary directory).
#
#   deploy/nats-cluster.sh start [DIR]   # start n1..n3; prints the --nats URL list
#   deploy/nats-cluster.sh stop-node N [DIR]   # kill node N (1..3), as a crash would
#   deploy/nats-cluster.sh start-node N [DIR]  # bring node N back (same store)
#   deploy/nats-cluster.sh stop [DIR]    # stop every node and remove DIR
#
# Ports: clients BASE..BASE+2 (default BASE=4222), routes BASE+2000.. (6222..).
# DIR defaults to ${TMPDIR:-/tmp}/halyard-nats-cluster. Halyard creates its streams with
# 3 replicas on a cluster of three nodes, so the loss of one node loses nothing.
set -euo pipefail

cmd=${1:-}
shift || true
NODES=3
BASE=${BASE:-4222}
ROUTE_BASE=$((BASE + 2000))
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}

node_dir() { echo "$DIR/n$1"; }

routes() {
  local r=() i
  for i in $(seq 1 $NODES); do r+=("nats://127.0.0.1:$((ROUTE_BASE + i - 1))"); done
  (IFS=,; echo "${r[*]}")
}

urls() {
  local u=() i
  for i in $(seq 1 $NODES); do u+=("nats://127.0.0.1:$((BASE + i - 1))"); done
  (IFS=,; echo "${u[*]}")
}

start_node() {
  local i=$1 d
  d=$(node_dir "$i")
  mkdir -p "$d/store"
  if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then
    echo "node $i already runs (pid $(cat "$d/pid"))"
    return
  fi
  "$NATS_SERVER" -js -sd "$d/store" -a 127.0.0.1 -p $((BASE + i - 1)) \
    --server_name "n$i" --cluster_name halyard \
    --cluster "nats://127.0.0.1:$((ROUTE_BASE + i - 1))" --routes "$(routes)" \
    >>"$d/nats-server.log" 2>&1 &
  echo $! >"$d/pid"
}

wait_ready() {
  local i=$1 d t
  d=$(node_dir "$i")
  for t in $(seq 1 100); do
    if grep -q "Server is ready" "$d/nats-server.log" 2>/dev/null; then return 0; fi
    if ! kill -0 "$(cat "$d/pid")" 2>/dev/null; then
      echo "node $i exited; its log:" >&2; tail -20 "$d/nats-server.log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "node $i not ready after 10 s; see $d/nats-server.log" >&2
  return 1
}

stop_node() {
  local i=$1 d
  d=$(node_dir "$i")
  if [ -f "$d/pid" ]; then
    kill -9 "$(cat "$d/pid")" 2>/dev/null || true
    rm -f "$d/pid"
  fi
}

DIR=${2:-${TMPDIR:-/tmp}/halyard-nats-cluster}
case "$cmd" in
  start)
    DIR=${1:-$DIR}
    mkdir -p "$DIR"
    for i in $(seq 1 $NODES); do start_node "$i"; done
    for i in $(seq 1 $NODES); do wait_ready "$i"; done
    echo "cluster running in $DIR"
    echo "HALYARD_NATS_URL=$(urls)"
    ;;
  stop-node) stop_node "${1:?node number}" ;;
  start-node) start_node "${1:?node number}"; wait_ready "$1" ;;
  stop)
    DIR=${1:-$DIR}
    for i in $(seq 1 $NODES); do stop_node "$i"; done
    rm -rf "$DIR"
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
