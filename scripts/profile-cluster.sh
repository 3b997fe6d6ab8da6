#!/usr/bin/env bash
# CPU profiles of a three-node cluster under committed deducts: starts
# three nodes on loopback (the cluster secret, plain HTTP), drives them
# with `stockd bench -strategy stockd-commit -scenario plentiful` from
# CONNS connections spread over the three, takes a CPU profile of every
# node at once in the middle of the load (/debug/pprof/profile, loopback
# needs no admin token), and prints each node's role, its CPU a committed
# deduct (from /proc, over the whole load) and the top of its profile.
# The profiles stay in OUT (default ./profiles) for go tool pprof.
#
# NODE_ARGS adds flags to every node (NODE_ARGS="-procs 1").
#
#   [NODE_ARGS=...] scripts/profile-cluster.sh [binary] [conns] [seconds]   (bin/stockd 64 8)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=$(realpath "${1:-bin/stockd}")
conns=${2:-64}
secs=${3:-8}
out=${OUT:-./profiles}
mkdir -p "$out"

start_work profile
# NODE_ARGS stays unquoted: it holds several flags.
# shellcheck disable=SC2086
start_cluster "$bin" "$work" ${NODE_ARGS:-}
urls=$(IFS=,; echo "${cluster_urls[*]}")

declare -A before
for i in 1 2 3; do before[$i]=$(cpu_ticks "${cluster_pids[$((i - 1))]}"); done
"$bin" bench -target "$urls" -strategy stockd-commit -scenario plentiful -conns "$conns" -requests 5000000 -duration $((secs + 6))s >"$work/bench.log" 2>&1 &
bench_pid=$!
sleep 3 # the load ramps up before the profiles start
curls=()
for i in 1 2 3; do
  curl -s -o "$out/n$i.pprof" "${cluster_urls[$((i - 1))]}/debug/pprof/profile?seconds=$secs" &
  curls+=($!)
done
wait "${curls[@]}"
wait "$bench_pid" || { cat "$work/bench.log"; exit 1; }
committed=$(awk '/^stockd-commit/ {for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) {n++; if (n == 2) {print $i; exit}}}' "$work/bench.log")
rate=$(awk '/^stockd-commit/ {for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) {print $i; exit}}' "$work/bench.log")
leader=$(curl -s "${cluster_urls[0]}/v1/cluster" | sed -n 's/.*"leader":"\([^"]*\)".*/\1/p')
hz=$(getconf CLK_TCK)
echo "three nodes, $conns connections: $rate committed deducts/s; leader $leader; wins $committed"
total=0
for i in 1 2 3; do
  t=$(( $(cpu_ticks "${cluster_pids[$((i - 1))]}") - ${before[$i]} ))
  total=$((total + t))
  awk -v n="n$i" -v l="$leader" -v t="$t" -v hz="$hz" -v c="$committed" 'BEGIN {
    printf "%s (%s): %.1f µs a committed deduct\n", n, (n == l) ? "leader" : "follower", t / hz / c * 1e6 }'
done
awk -v t="$total" -v hz="$hz" -v c="$committed" 'BEGIN { printf "summed over the three: %.1f µs a committed deduct\n", t / hz / c * 1e6 }'
for i in 1 2 3; do
  echo "n$i: $(curl -s "${cluster_urls[$((i - 1))]}/metrics" | awk '$1 == "stockd_http_event_loop_handovers_total" {print $2}') connections handed from the event loop to fasthttp"
done
for i in 1 2 3; do
  echo "--- n$i, top of $out/n$i.pprof"
  go tool pprof -top -nodecount=25 "$bin" "$out/n$i.pprof" 2>/dev/null | sed -n '4,32p'
done
grep -E "^stockd-commit|cpu per deduct" "$work/bench.log" || true
