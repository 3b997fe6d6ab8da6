#!/usr/bin/env bash
# Backups at the size of a real sale: three nodes on certificates
# `stockd cert` makes (node-to-node TLS, HTTPS clients), a flash sale
# driven by `stockd bench` over many connections to all three, and
# `stockd backup` taken back to back from a follower meanwhile, each
# file checked with `stockd backup verify`. Prints the backups taken,
# the failures, and the bench's row (oversold must be 0, wins the
# units). Everything lives in a temp dir on free loopback ports; the
# nodes are stopped through their PIDs.
#
#   scripts/bench-backup-crowd.sh [binary] [connections] [units] [buyers]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
conns=${2:-1000}
units=${3:-20000}
buyers=${4:-400000}

start_work backup-crowd

certs="$work/certs"
"$bin" cert ca -out "$certs" >/dev/null
peers="" http=() urls=""
for i in 1 2 3; do
  "$bin" cert node -ca "$certs" -id "n$i" -host 127.0.0.1 -out "$certs" >/dev/null
  raft[$i]=$(free_port); http[$i]=$(free_port)
  peers="$peers${peers:+,}n$i=127.0.0.1:${raft[$i]}"
  urls="$urls${urls:+,}https://127.0.0.1:${http[$i]}"
done
for i in 1 2 3; do
  "$bin" serve -id "n$i" -http "127.0.0.1:${http[$i]}" -raft "127.0.0.1:${raft[$i]}" -data "$work/n$i" -peers "$peers" \
    -node-cert "$certs/n$i.pem" -node-key "$certs/n$i-key.pem" -node-ca "$certs/ca.pem" \
    -http-cert "$certs/n$i.pem" -http-key "$certs/n$i-key.pem" -log-level warn >"$work/n$i.log" 2>&1 &
  pids+=("$!")
done
follower=""
for _ in $(seq 1 300); do
  for i in 1 2 3; do
    state=$(curl -sf --cacert "$certs/ca.pem" "https://127.0.0.1:${http[$i]}/readyz" 2>/dev/null || true)
    case $state in *'"ready":true'*) ;; *) continue ;; esac
    leader=$(echo "$state" | sed -n 's/.*"leader":"\([^"]*\)".*/\1/p')
    if [ -n "$leader" ] && [ "$leader" != "n$i" ]; then follower=$i; break 2; fi
  done
  sleep 0.1
done
if [ -z "$follower" ]; then
  echo "no ready follower in 30 s; the nodes' logs:" >&2
  tail -5 "$work"/n*.log >&2
  exit 1
fi
target="https://127.0.0.1:${http[$follower]}"
echo "three nodes on certificates; backups from n$follower ($target) while $conns connections buy $units units"

"$bin" bench -target "$urls" -ca "$certs/ca.pem" -conns "$conns" -scenario flash -units "$units" -requests "$buyers" \
  -duration 120s -strategy stockd-commit -progress=false >"$work/bench.txt" 2>&1 &
bench=$!
taken=0 failed=0 first="" last=""
while kill -0 "$bench" 2>/dev/null; do
  out="$work/b$taken.backup"
  if "$bin" backup -target "$target" -ca "$certs/ca.pem" -out "$out" >"$work/backup.txt" 2>&1; then
    if "$bin" backup verify "$out" >/dev/null 2>&1; then
      taken=$((taken + 1))
    else
      failed=$((failed + 1)); echo "a backup did not verify: $("$bin" backup verify "$out" 2>&1 | tail -1)"
    fi
    [ "$taken" = 1 ] && first=$(cat "$work/backup.txt")
    last=$(cat "$work/backup.txt")
    rm -f "$out"
  elif kill -0 "$bench" 2>/dev/null; then
    failed=$((failed + 1)); echo "a backup failed: $(tail -1 "$work/backup.txt")"
  fi
done
wait "$bench" || { echo "the bench failed:"; cat "$work/bench.txt"; exit 1; }
echo "backups taken and verified during the sale: $taken, failed: $failed"
echo "the first: ${first:-none}"
echo "the last:  ${last:-none}"
grep -E "^stockd-commit|^oversold" "$work/bench.txt"
[ "$failed" = 0 ]
