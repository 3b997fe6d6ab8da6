#!/usr/bin/env bash
# The batch route's server CPU a unit, two builds alternated: each run
# starts a fresh node of one build (default flags, on the last CPU),
# drives POST /v1/deducts with wrk (100 buyers a request, each with its
# own user and request id, 64 connections, on the other CPUs) for a few
# rows back to back, and prints each row's CPU a unit (utime + stime from
# /proc/<pid>/stat over the units sold); then the same for the other
# build, and so on. A shared host's speed drifts by a fifth from minute to
# minute, so only builds measured in turn, and over several runs, are
# compared: the last line gives each build's mean over all its rows.
# The node holds a few million orders by its last row, past the default
# -request-max-keep, so the prunes are in the figure. Stops each node
# through its PID.
#
#   scripts/bench-batch-ab.sh BINARY_A BINARY_B [runs] [rows] [seconds a row]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

a=${1:?binary A}
b=${2:?binary B}
runs=${3:-3}
rows=${4:-4}
secs=${5:-10}

need_cmds wrk:wrk
last=$(( $(nproc) - 1 ))
if [ "$last" -lt 1 ]; then
  echo "needs two CPUs: one for the node, one for wrk" >&2
  exit 1
fi
server_pin=(taskset -c "$last")
client_pin=(taskset -c "0-$((last - 1))")

start_work batch-ab
batch_lua "$work/batch.lua"

# run BINARY: one fresh node, rows of batches; prints the row figures.
run() {
  local bin=$1 t0 t1 n0 n1 out="" r
  rm -rf "$work/data"
  start_node "$bin" "$work/data" "$work/node.log"
  pids=("$node_pid")
  curl -sf -X PUT "$url/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null
  for r in $(seq 1 "$rows"); do
    t0=$(cpu_ticks "$node_pid"); n0=$(committed_deducts "$url")
    "${client_pin[@]}" wrk -t1 -c64 -d"${secs}s" -s "$work/batch.lua" "$url/v1/deducts" -- "$$-$RANDOM-$r" >"$work/wrk.out"
    t1=$(cpu_ticks "$node_pid"); n1=$(committed_deducts "$url")
    if [ "$((n1 - n0))" -le 0 ]; then
      echo "row $r sold nothing; wrk said:" >&2; cat "$work/wrk.out" >&2; exit 1
    fi
    out="$out $(awk -v t=$((t1 - t0)) -v n=$((n1 - n0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')"
  done
  stop_pid "$node_pid"
  pids=()
  echo "$out"
}

echo "µs of server CPU a unit, rows of ${secs}s, fresh node each run; A = $a, B = $b"
all_a="" all_b=""
for i in $(seq 1 "$runs"); do
  ra=$(run "$a"); echo "run $i A:$ra"; all_a="$all_a$ra"
  rb=$(run "$b"); echo "run $i B:$rb"; all_b="$all_b$rb"
done
mean() { echo "$1" | awk '{ for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF }'; }
echo "means over ${runs} runs of ${rows} rows: A $(mean "$all_a") µs a unit, B $(mean "$all_b") µs a unit"
