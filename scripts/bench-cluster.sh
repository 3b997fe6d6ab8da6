#!/usr/bin/env bash
# Three stockd nodes against replicated Redis, with one stockd node beside
# them, in one run of several rounds. Every row is driven by the bench's
# Go client with CONNS goroutines, one request at a time each, plentiful
# stock (every deduct wins, each with its own request id):
#
#   - stockd, one node, and stockd, three nodes (`stockd bench -launch
#     1,3`, fresh nodes every round, the cluster secret between them),
#     committed deducts (wait=commit: in the raft log of a quorum, fsynced);
#   - Redis + the bench's idempotent Lua deduct (the request id kept in a
#     hash, a repeat answers the same) on a primary with two replicas,
#     appendonly with appendfsync always on all three, every deduct
#     followed by WAIT 1 in the same round trip (`-redis-wait 1`): an
#     acknowledged write is on two of the three processes (WAIT waits for
#     a replica to receive it, not to fsync it).
#
# A row's server CPU is the utime + stime of its server processes only
# (the three nodes, the three Redis processes), from /proc, summed, over
# the deducts answered. Each round prints the rates and CPUs, the three
# nodes' rate over Redis's and their CPU over one node's; the run ends
# with how many rounds met the bars (three nodes at or above Redis's rate,
# at most 3.0x one node's CPU). TLS=1 runs the stockd rows on node
# certificates (`-launch 1tls,3tls`: clients and nodes on TLS) and leaves
# Redis out; TLS=peer puts only the traffic between the nodes on TLS
# (`-launch 1,3peertls`: raft and forwarded takes over mutually
# authenticated TLS, clients on plain HTTP as before), Redis left out too. CLIENT=BINARY runs the bench (the load client) from another
# binary than the nodes' (an older stockd's nodes measured by today's
# client); NODE_ARGS adds flags to every node (NODE_ARGS="-procs 1": one
# thread of Go code a node, as each Redis process runs its commands on
# one). Installs redis-server from Debian packages when missing;
# stops what it started through its own PIDs.
#
# Each round also prints the load client's own CPU a deduct on each side.
#
#   [TLS=1|peer] [CLIENT=binary] [NODE_ARGS=flags] scripts/bench-cluster.sh [binary] [seconds per row] [conns] [rounds]   (bin/stockd 10 64 3)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=$(realpath "${1:-bin/stockd}")
secs=${2:-10}
conns=${3:-64}
rounds=${4:-3}
tls=${TLS:-}
client=$(realpath "${CLIENT:-$bin}")

start_work cluster
launch=1,3 one=stockd-commit three="stockd-commit (3 nodes)"
case $tls in
  '') ;;
  peer) launch=1,3peertls three="stockd-commit (3 nodes) peer TLS" ;;
  *) launch=1tls,3tls one="stockd-commit TLS" three="stockd-commit (3 nodes) TLS" ;;
esac

# A Redis primary and two replicas, appendfsync always on each.
redis_pids=()
if [ -z "$tls" ]; then
  need_cmds redis-server:redis-server redis-cli:redis-tools
  primary=$(free_port)
  for i in 0 1 2; do
    port=$primary
    [ "$i" -gt 0 ] && port=$(free_port)
    args=(--port "$port" --bind 127.0.0.1 --dir "$work/redis$i" --appendonly yes --appendfsync always --save "" --daemonize no)
    [ "$i" -gt 0 ] && args+=(--replicaof 127.0.0.1 "$primary")
    mkdir -p "$work/redis$i"
    redis-server "${args[@]}" >"$work/redis$i.log" 2>&1 &
    pids+=($!); redis_pids+=($!)
    wait_port "$port"
  done
  for _ in $(seq 1 200); do
    [ "$(redis-cli -p "$primary" INFO replication | tr -d '\r' | awk -F: '$1 == "connected_slaves" {print $2}')" = 2 ] && break
    sleep 0.05
  done
  redis-cli -p "$primary" INFO replication | tr -d '\r' | grep -q '^connected_slaves:2' || { echo "the replicas did not connect"; exit 1; }
fi
redis_list=$(IFS=,; echo "${redis_pids[*]}")

# bench_rows LOG ARGS...: one bench invocation; its rows' lines stay in LOG.
bench_rows() {
  local log=$1
  shift
  "$client" bench -scenario plentiful -conns "$conns" -duration "${secs}s" -requests 10000000 -progress=false "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
}
# rate_of LOG ROW: the deducts/s of the row whose strategy column is ROW
# (the number before the p50 latency).
rate_of() { awk -v r="$2" 'index($0, r) == 1 { n = split(substr($0, length(r) + 1), f, " "); for (i = 1; i < n; i++) if (f[i] ~ /^[0-9]+$/ && f[i + 1] ~ /s$/) { print f[i]; exit } }' "$1"; }
# cpu_of LOG ROW: the server CPU a deduct of ROW (µs), from the cpu line.
cpu_of() { awk -v r="(plentiful, $2)" 'index($0, "cpu per deduct") && index($0, r) { sub(/.*server /, ""); print $1 + 0; exit }' "$1"; }
# client_of LOG ROW: the bench client's CPU a deduct of ROW (µs): it rises
# with the machine's load, so a slow round shows on both sides.
client_of() { awk -v r="(plentiful, $2)" 'index($0, "cpu per deduct") && index($0, r) { sub(/.*cpu per deduct: client /, ""); print $1 + 0; exit }' "$1"; }

echo "rows of ${secs}s, $conns connections, plentiful stock, $rounds rounds; $(nproc) cores shared by the client and the servers${tls:+; TLS ($launch)}${NODE_ARGS:+; nodes with $NODE_ARGS}"
met_rate=0 met_cpu=0
for round in $(seq 1 "$rounds"); do
  bench_rows "$work/stockd.log" -launch "$launch" -binary "$bin" -strategy stockd-commit ${NODE_ARGS:+-node-args "$NODE_ARGS"}
  r1=$(rate_of "$work/stockd.log" "$one "); c1=$(cpu_of "$work/stockd.log" "$one")
  r3=$(rate_of "$work/stockd.log" "$three "); c3=$(cpu_of "$work/stockd.log" "$three")
  if [ -z "$r1" ] || [ -z "$r3" ] || [ -z "$c1" ] || [ -z "$c3" ]; then
    echo "round $round: could not read the stockd rows:"; cat "$work/stockd.log"; exit 1
  fi
  grep -q "^oversold: 0  flips: 0  late wins: 0" "$work/stockd.log" || { echo "a stockd row failed its checks:"; cat "$work/stockd.log"; exit 1; }
  k3=$(client_of "$work/stockd.log" "$three")
  line=$(awk -v r1="$r1" -v c1="$c1" -v r3="$r3" -v c3="$c3" -v k3="$k3" 'BEGIN {
    printf "stockd 1 node %d/s %.1f µs; 3 nodes %d/s %.1f µs summed (%.2fx one node'"'"'s CPU; the client %.1f µs a deduct)", r1, c1, r3, c3, c3 / c1, k3 }')
  awk -v c1="$c1" -v c3="$c3" 'BEGIN { exit !(c3 <= 3.0 * c1) }' && met_cpu=$((met_cpu + 1))
  if [ -z "$tls" ]; then
    bench_rows "$work/redis.log" -strategy redis-lua -redis "127.0.0.1:$primary" -redis-wait 1 -redis-pids "$redis_list"
    rr=$(rate_of "$work/redis.log" "redis-lua "); cr=$(cpu_of "$work/redis.log" "redis-lua"); kr=$(client_of "$work/redis.log" "redis-lua")
    errs=$(awk 'index($0, "redis-lua ") == 1 { print $(NF - 2); exit }' "$work/redis.log")
    [ -n "$rr" ] && [ -n "$cr" ] || { echo "round $round: could not read the Redis row:"; cat "$work/redis.log"; exit 1; }
    line="$line; Redis primary + 2 replicas, WAIT 1: $rr/s $cr µs summed (errors $errs; the client $kr µs a deduct); 3 nodes' rate $(awk -v a="$r3" -v b="$rr" 'BEGIN {printf "%.2f", a / b}')x Redis's, CPU $(awk -v a="$c3" -v b="$cr" 'BEGIN {printf "%.2f", a / b}')x"
    awk -v a="$r3" -v b="$rr" 'BEGIN { exit !(a >= b) }' && met_rate=$((met_rate + 1))
  fi
  echo "round $round: $line"
done
echo "rounds where three nodes' summed CPU a deduct was at most 3.0x one node's: $met_cpu of $rounds"
[ -z "$tls" ] && echo "rounds where three nodes sold at or above replicated Redis's rate: $met_rate of $rounds"
