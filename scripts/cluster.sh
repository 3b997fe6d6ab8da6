#!/usr/bin/env bash
# Starts or stops three local stockd nodes on loopback, data under
# ./data/cluster/, on certificates `stockd cert` makes there once
# (./data/cluster/certs): raft and node-to-node calls on mutually
# authenticated TLS, clients on HTTPS (curl --cacert data/cluster/certs/ca.pem).
# Each node is stopped through the PID file written when it was started,
# never by name.
#
#   scripts/cluster.sh start [binary]   start n1..n3, print their URLs and the leader
#   scripts/cluster.sh stop             SIGTERM each node by its PID, wait for it
set -euo pipefail

dir=./data/cluster
bin=${2:-bin/stockd}
peers="n1=127.0.0.1:7001,n2=127.0.0.1:7002,n3=127.0.0.1:7003"

start() {
  mkdir -p "$dir"
  # A CA, a certificate for each node and one for a client, made once
  # and kept (keys mode 600) so that restarts use the same ones.
  certs="$dir/certs"
  if [ ! -s "$certs/ca.pem" ]; then
    "$bin" cert ca -out "$certs"
    for i in 1 2 3; do
      "$bin" cert node -ca "$certs" -id "n$i" -host 127.0.0.1,localhost -out "$certs"
    done
    "$bin" cert client -ca "$certs" -name client -out "$certs"
  fi
  for i in 1 2 3; do
    pidfile="$dir/n$i.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "n$i already running (pid $(cat "$pidfile"))"
      continue
    fi
    "$bin" serve -id "n$i" -http "127.0.0.1:808$i" -raft "127.0.0.1:700$i" -data "$dir/n$i" -peers "$peers" \
      -node-cert "$certs/n$i.pem" -node-key "$certs/n$i-key.pem" -node-ca "$certs/ca.pem" \
      -http-cert "$certs/n$i.pem" -http-key "$certs/n$i-key.pem" >>"$dir/n$i.log" 2>&1 &
    echo $! >"$pidfile"
  done
  for i in 1 2 3; do
    for _ in $(seq 1 100); do
      if curl -sf --cacert "$certs/ca.pem" "https://127.0.0.1:808$i/readyz" >/dev/null 2>&1; then break; fi
      sleep 0.1
    done
  done
  for i in 1 2 3; do
    echo "n$i  https://127.0.0.1:808$i  (log $dir/n$i.log)"
  done
  echo "clients: curl --cacert $certs/ca.pem https://127.0.0.1:8081/v1/cluster"
  leader=$(curl -s --cacert "$certs/ca.pem" https://127.0.0.1:8081/v1/cluster | sed -n 's/.*"leader":"\([^"]*\)".*/\1/p')
  echo "leader: ${leader:-none yet}"
}

stop() {
  for i in 1 2 3; do
    pidfile="$dir/n$i.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "n$i (pid $pid) did not stop in 15s; killing it"
        kill -KILL "$pid"
      fi
      echo "n$i stopped"
    fi
    rm -f "$pidfile"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start [binary] | stop" >&2; exit 2 ;;
esac
