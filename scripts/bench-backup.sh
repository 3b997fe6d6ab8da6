#!/usr/bin/env bash
# A backup of a node holding many orders: its size, the time it takes,
# the node's peak memory while it is taken, and committed deducts per
# second with and without backups being taken, in one run. One node with
# default flags is filled with batch deducts (each order with its own
# request id), then wrk drives single committed deducts twice: once
# alone, once while backups are taken back to back. Installs wrk from
# Debian packages when missing; stops the node through its PID.
#
#   scripts/bench-backup.sh [binary] [orders] [seconds per phase]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
orders=${2:-1000000}
secs=${3:-10}

need_cmds wrk:wrk

work=$(mktemp -d /tmp/stockd-backup-bench-XXXXXX)
node_pid=""
cleanup() {
  [ -n "$node_pid" ] && stop_pid "$node_pid"
  rm -rf "$work"
}
trap cleanup EXIT

start_node "$bin" "$work/data" "$work/stockd.log"

echo "filling the node with $orders orders (batch deducts, each with its own request id)"
"$bin" bench -target "$url" -scenario plentiful -strategy stockd-batch -requests "$orders" -duration 600s -progress=false >"$work/fill.txt"
curl -sf -X PUT "$url/v1/skus/single" -d '{"total":100000000}' >/dev/null
settle "$url"
held=$(curl -sf "$url/v1/stats" | tr ',' '\n' | awk -F: '/"sold"/ {s += $2} END {printf "%d", s}')
echo "the ledger holds $held orders; ledger.db $(( $(stat -c %s "$work/data/ledger.db") >> 20 )) MiB"

deduct_lua "$work/deduct.lua"

rate() { awk '/Requests\/sec/ {printf "%.0f", $2}'; }
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$node_pid/status"; }

without=$(wrk -t1 -c64 -d"${secs}s" -s "$work/deduct.lua" "$url/v1/skus/single/deduct" -- "a$RANDOM" | rate)
settle "$url"

# Backups back to back while wrk runs; the node's peak resident memory is
# reset first (clear_refs 5), so VmHWM is the peak while they are taken.
echo 5 >"/proc/$node_pid/clear_refs" 2>/dev/null || true
rss_before=$(kib VmRSS)
wrk -t1 -c64 -d"${secs}s" -s "$work/deduct.lua" "$url/v1/skus/single/deduct" -- "b$RANDOM" >"$work/with.txt" &
wrk_pid=$!
n=0
: >"$work/times"
while kill -0 "$wrk_pid" 2>/dev/null; do
  curl -sf -o "${BACKUP_OUT:-$work/b.backup}" -w '%{time_total} %{size_download}\n' "$url/v1/backup" >>"$work/times" || break
  n=$((n + 1))
done
wait "$wrk_pid"
with=$(rate <"$work/with.txt")
hwm=$(kib VmHWM)
[ -z "${BACKUP_OUT:-}" ] && "$bin" backup verify "$work/b.backup" >/dev/null
echo "backups taken during the load: $n, each verified size $(awk 'END {printf "%.0f", $2 / 1048576}' "$work/times") MiB," \
  "$(awk '{s += $1} END {printf "%.2f", s / NR}' "$work/times") s each on average"
echo "node resident memory: $(( rss_before >> 10 )) MiB before, peak $(( hwm >> 10 )) MiB while the backups were taken"
echo "committed deducts, 64 connections: ${without}/s without backups, ${with}/s while they were taken ($(awk -v a="$with" -v b="$without" 'BEGIN {printf "%.2f", a / b}')x)"
