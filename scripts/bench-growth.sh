#!/usr/bin/env bash
# Does a node's cost grow with what its ledger holds? One node with
# default flags is driven through rounds of the mixed sequence a sale
# sees: single committed deducts, sold-out answers (each with its own
# request id), then batch deducts (100 buyers a request); each round adds
# about a million orders. Every round prints the batch phase's units per
# second and the node's CPU per unit (from /proc/<pid>/stat), the orders
# in the ledger, and the node's resident memory (VmRSS, and VmHWM, its
# peak). The batch phase's bench ends without its audit, whose recount of
# every order would be charged to the units (7 % of round 9's CPU): the
# script audits every sale itself once it has read the node's CPU, and
# fails when an audit does not pass. Stops the node through its PID.
#
# A shared host's speed drifts between rounds (the bench client's own CPU
# per request, the same work in every round, moved by a third in one run),
# so every round also measures three baselines in the same minute: the
# no-op server's CPU per request under wrk for 3 s, the bench client's
# CPU per batch request, and a fresh node (the same binary on an empty
# data directory, started for the round and stopped after) doing the
# same batch phase: round 1's work at this minute's speed. The node's CPU
# per unit is printed against each ("x no-op", "x client", "x fresh");
# "x fresh" is the growth that comes from what the ledger holds.
#
#   scripts/bench-growth.sh [binary] [rounds] [batch units a round]
#
# Five rounds of two million units reach ten million orders with batch
# phases of 13-14 s here; phases of one million (5 s) moved by a fifth
# from minute to minute against any of the baselines.
#
# GROWTH_LOG=DIR keeps each round's bench output and the node's log there.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
rounds=${2:-8}
batch=${3:-1000000}

work=$(mktemp -d /tmp/stockd-growth-XXXXXX)
logs=${GROWTH_LOG:-$work/logs}
mkdir -p "$logs"
node_pid="" fresh_pid="" grown_pid=""
cleanup() {
  [ -n "$node_pid" ] && stop_pid "$node_pid"
  [ -n "$grown_pid" ] && stop_pid "$grown_pid"
  [ -n "$fresh_pid" ] && stop_pid "$fresh_pid"
  [ -n "${noop_pid:-}" ] && stop_pid "$noop_pid"
  rm -rf "$work"
}
trap cleanup EXIT

hz=$(getconf CLK_TCK)
# VmHWM counts the ledger file's pages the node has mapped in (a recount
# reads them all); the anonymous peak is the node's own memory, sampled
# every 0.2 s by a loop of this script.
mem() {
  awk '/^VmRSS|^VmHWM|^RssAnon/ {printf "%s %d MiB  ", $1, $2 / 1024}' "/proc/$1/status"
  printf "anon peak %d MiB" "$(( $(cat "$work/anon-peak" 2>/dev/null || echo 0) / 1024 ))"
}
sample_anon() {
  local peak=0 kib
  while kill -0 "$1" 2>/dev/null; do
    kib=$(awk '/^RssAnon/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
    if [ "${kib:-0}" -gt "$peak" ]; then peak=$kib; echo "$peak" >"$work/anon-peak"; fi
    sleep 0.2
  done
}

need_cmds wrk:wrk
start_node "$bin" "$work/data" "$logs/stockd.log"
sample_anon "$node_pid" &
noop_port=$(free_port)
"$bin" noop-server -http "127.0.0.1:$noop_port" >"$logs/noop.log" 2>&1 &
noop_pid=$!
wait_port "$noop_port"

# noop_cpu: the no-op server's CPU per request (µs) under wrk for 3 s.
noop_cpu() {
  local t0 t1 n
  t0=$(cpu_ticks "$noop_pid")
  n=$(wrk -t1 -c64 -d3s "http://127.0.0.1:$noop_port/" 2>/dev/null | awk '/requests in/ {print $1}')
  t1=$(cpu_ticks "$noop_pid")
  awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="${n:-0}" 'BEGIN {if (n > 0) printf "%.2f", (b - a) / hz * 1e6 / n; else print 0}'
}


orders() {
  curl -sf "$url/v1/stats" | tr ',' '\n' | awk -F: '/"sold"/ {s += $2} END {printf "%d", s}'
}

# audit_all: every sale's audit must pass (the conservation law and the
# recount of its orders, and the node's own law); the script stops
# otherwise.
audit_all() {
  local sku a
  for sku in $(curl -sf "$url/v1/stats" | tr ',{' '\n\n' | awk -F'"' '$2 == "sku" {print $4}'); do
    a=$(curl -sf "$url/v1/skus/$sku/audit")
    if ! echo "$a" | grep -q '"ok":true' || echo "$a" | grep -q '"ok":false'; then
      echo "the audit of $sku did not pass: $a" >&2
      exit 1
    fi
  done
}

# batch_phase URL PID NAME [PROFILE]: the batch phase against the node
# at URL, its output kept in $logs/NAME.txt and .json, with a CPU
# profile of its first 5 s to PROFILE when given; sets rate, errors,
# per (the node's CPU per unit, the ledger file's write-behind
# included), client (the bench client's CPU per request) and behind.
batch_phase() {
  local u=$1 pid=$2 name=$3 profile=${4:-} t0 t1 s0 out row wins prof=""
  settle "$u"
  t0=$(cpu_ticks "$pid")
  if [ -n "$profile" ]; then
    curl -sf -o "$profile" "$u/debug/pprof/profile?seconds=5" &
    prof=$!
  fi
  out=$("$bin" bench -target "$u" -scenario plentiful -strategy stockd-batch -requests "$batch" -duration 120s -progress=false -no-final-audit -json "$logs/$name.json")
  echo "$out" >"$logs/$name.txt"
  [ -n "$prof" ] && wait "$prof"
  s0=$(date +%s.%N)
  settle "$u" # the ledger file is written behind: its share of these units counts
  t1=$(cpu_ticks "$pid")
  behind=$(echo "$(date +%s.%N) - $s0" | bc -l)
  # The row: name, durability (words), deducts/s, p50, p99, p99.9 (marked *), wins, losses, errors, oversold, vs commit.
  row=$(echo "$out" | awk '$1 == "stockd-batch"')
  rate=$(echo "$row" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/ && $i > 1000) {print $i; exit}}')
  wins=$(echo "$row" | awk '{print $(NF-4)}')
  errors=$(echo "$row" | awk '{print $(NF-2)}')
  per=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="${wins:-0}" 'BEGIN {if (n > 0) printf "%.2f", (b - a) / hz * 1e6 / n; else print 0}')
  client=$(echo "$out" | sed -n 's/.*cpu per deduct: client \([0-9.]*\) µs.*/\1/p' | head -1)
}

# fresh_batch R: the batch phase on a fresh node (the same binary on an
# empty data directory), stopped after; sets what batch_phase sets.
# start_node's node_pid and url stay local here, so the grown node's
# remain the script's.
fresh_batch() {
  local node_pid url
  rm -rf "$work/fresh"
  start_node "$bin" "$work/fresh" "$logs/fresh.log"
  fresh_pid=$node_pid
  batch_phase "$url" "$fresh_pid" "round$1-fresh"
  stop_pid "$fresh_pid"
  fresh_pid=""
}

grown_pid=$node_pid # for cleanup, should the fresh node fail to start
echo "round  batch units/s  batch errors  node CPU per batch unit  x no-op  x client  x fresh  write-behind after  orders in the ledger  memory"
for r in $(seq 1 "$rounds"); do
  "$bin" bench -target "$url" -scenario plentiful -strategy stockd-commit -requests 150000 -duration 6s -progress=false >"$logs/round$r-commit.txt"
  "$bin" bench -target "$url" -scenario flash -units 100 -strategy stockd-commit -requests 150000 -duration 6s -progress=false >"$logs/round$r-soldout.txt"
  # The baseline first, so that the grown node's phase is the last to set
  # the row's figures.
  fresh_batch "$r"
  fresh=$per
  profile=""
  if [ -n "${GROWTH_LOG:-}" ] && { [ "$r" = 1 ] || [ "$r" = "$rounds" ]; }; then
    # A CPU profile of the batch phase's first 5 s, in the first and the last round.
    profile="$logs/round$r-batch.pprof"
  fi
  batch_phase "$url" "$node_pid" "round$r-batch" "$profile"
  audit_all
  noop=$(noop_cpu)
  ratios=$(awk -v u="$per" -v np="$noop" -v c="${client:-0}" -v f="$fresh" 'BEGIN {
    printf "%7s  %8s  %7s", (np > 0 ? sprintf("%.3f", u / np) : "-"), (c > 0 ? sprintf("%.2f", u / c) : "-"), (f > 0 ? sprintf("%.2f", u / f) : "-") }')
  printf "%5d  %13s  %12s  %20s µs  %s  %17.1fs  %20s  %s\n" "$r" "${rate:-?}" "${errors:-?}" "$per" "$ratios" "$behind" "$(orders)" "$(mem "$node_pid")"
done
