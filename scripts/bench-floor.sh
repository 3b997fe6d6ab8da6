#!/usr/bin/env bash
# The server's CPU per request, with the lightest standard client of each
# protocol, in one run: wrk against stockd's no-op HTTP server (a GET, and
# the deduct's own POST with its JSON body), against a
# stockd node's committed deducts (every one wins, each with its own
# request id), the same wins answered before their commit (wait=none),
# and its sold-out answers (each with its own request id);
# redis-benchmark against Redis + the bench's Lua deduct with
# appendfsync always, one call at a time and pipelined 100 deep. Each row
# gives the rate and the server process's CPU (utime + stime from
# /proc/<pid>/stat) divided by the requests it answered. The servers start
# once and every round measures all of them back to back, then prints its
# ratios: on a shared host a neighbour's load moves whole minutes, and a
# ratio within one round is what stays comparable. Installs wrk and
# redis-server from Debian packages when missing; stops what it started
# through its own PIDs. Each round starts with what a syscall and a
# context switch cost on the machine at that moment (`perf bench`, when
# perf is installed): the no-op's floor moves with them from day to day.
# Redis answering PING is its own floor, beside stockd's no-op.
# Redis + Lua runs right after stockd's committed deducts, and Redis
# pipelined right after stockd's batch route: the rows a rate ratio
# compares are seconds apart. The run ends with the median of each bar's
# ratio over the rounds, and how many rounds met it.
# The node with default flags serves plain deducts from its event loop; a
# second node runs with -http-event-loop=false (fasthttp serves every
# request): its sold-out and committed rows follow the default node's,
# and each round's line ends with its ratios. A third node runs with
# -procs 1 (Go code on one thread at a time, as Redis runs its commands on
# one): its committed row follows Redis's, and the round's line gives its
# CPU beside Redis's.
#
# With PIN=1 every server (the no-op, both nodes, Redis) runs on the last
# CPU and every client (wrk, redis-benchmark) on the others (taskset):
# each server gets one core to itself, the same for all, and the client's
# load stays off it. A Go server started on one CPU runs with
# GOMAXPROCS=1, from its affinity; Redis serves from one thread anyway.
#
# With PARTS=1 (and perf installed), the rows of the no-op (the deduct's
# request), the committed deduct, Redis + Lua and Redis's PING are also
# sampled by `perf record` (kernel and user stacks), and each round ends
# with a table of where their server CPU a request went
# (scripts/cpu-parts.awk sorts the samples). The sampling costs those
# rows a few percent more CPU, so a PARTS run's ratios are not the
# bars' readings. Kernel stacks need root, or kernel.perf_event_paranoid
# at 1 or below.
#
#   [PIN=1] [PARTS=1] scripts/bench-floor.sh [binary] [seconds per row] [connections] [rounds]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
secs=${2:-10}
conns=${3:-64}
rounds=${4:-3}

need_cmds wrk:wrk redis-server:redis-server redis-benchmark:redis-tools
parts=${PARTS:-}
if [ -n "$parts" ]; then
  need_cmds perf:linux-perf
  parts_awk="$(dirname "$0")/cpu-parts.awk"
fi

start_work floor

# PIN: servers on the last CPU, clients on the others; every server and
# client starts through server_pin or client_pin (empty: unpinned).
server_pin=() client_pin=()
if [ -n "${PIN:-}" ]; then
  need_cmds taskset:util-linux
  last=$(( $(nproc) - 1 ))
  [ "$last" -ge 1 ] || { echo "PIN=1 needs two CPUs or more" >&2; exit 1; }
  server_pin=(taskset -c "$last") client_pin=(taskset -c "0-$((last - 1))")
fi

hz=$(getconf CLK_TCK)

# row NAME PID REQUESTS TICKS_BEFORE TICKS_AFTER SECONDS [CLIENT_CPU_SECONDS]:
# prints the row and sets rate (requests a second) and cpu (server µs a
# request) for the round's ratios.
rate=0; cpu=0
row() {
  local name=$1 pid=$2 n=$3 t0=$4 t1=$5 s=$6 c=${7:-}
  if [ -z "$n" ] || [ "$n" -le 0 ]; then
    printf "%-44s no requests answered\n" "$name"; rate=0; cpu=0; return
  fi
  rate=$(awk -v n="$n" -v s="$s" 'BEGIN {printf "%.0f", n / s}')
  cpu=$(awk -v n="$n" -v t0="$t0" -v t1="$t1" -v hz="$hz" 'BEGIN {printf "%.2f", (t1 - t0) / hz * 1e6 / n}')
  awk -v name="$name" -v r="$rate" -v u="$cpu" -v n="$n" -v c="$c" 'BEGIN {
    printf "%-44s %10.0f/s   server CPU %6.1f µs a request", name, r, u
    if (c != "") printf "   client CPU %5.1f µs", c * 1e6 / n
    printf "\n" }'
}

# timed OUT CMD...: runs the load client CMD with its output in OUT and
# sets client_cpu to the CPU seconds it used (user + system), so that
# each row shows the client's cost beside the server's: on two shared
# cores a heavier client slows the server it drives.
client_cpu=""
timed() {
  local out=$1 t
  shift
  sample_start
  # A client stopped by timeout exits non-zero; what it did still counts.
  t=$( { TIMEFORMAT='%3U %3S'; time ${client_pin[@]+"${client_pin[@]}"} "$@" >"$out" 2>/dev/null || true; } 2>&1 )
  sample_stop
  client_cpu=$(echo "$t" | awk '{print $1 + $2}')
}

# sample_start, sample_stop: with PARTS set, `perf record` of the server
# process parts_pid while a row runs whose caller set parts_tag (for that
# one call: parts_tag=commit parts_pid=... wrk_row ...), into
# $work/parts-<tag>.data.
perf_pid="" parts_tag="" parts_pid=""
sample_start() {
  [ -n "$parts" ] && [ -n "${parts_tag:-}" ] || return 0
  perf record -q -e cpu-clock -F 999 -g -p "$parts_pid" -o "$work/parts-$parts_tag.data" >/dev/null 2>&1 &
  perf_pid=$!
}
sample_stop() {
  [ -n "$perf_pid" ] || return 0
  kill -INT "$perf_pid" 2>/dev/null || true
  wait "$perf_pid" 2>/dev/null || true
  perf_pid=""
}

# parts_table TAG:CPU...: each tagged row's server CPU a request (CPU,
# µs) split into parts by this round's samples, one column a row.
parts_table() {
  local col tag files=() heads=()
  for col in "$@"; do
    tag=${col%%:*}
    [ -s "$work/parts-$tag.data" ] || continue
    perf script -i "$work/parts-$tag.data" 2>/dev/null | awk -f "$parts_awk" |
      awk -F'\t' -v cpu="${col#*:}" '{printf "%s\t%.2f\n", $1, $2 * cpu}' >"$work/parts-$tag.tsv"
    files+=("$work/parts-$tag.tsv"); heads+=("$tag")
  done
  if [ ${#files[@]} -eq 0 ]; then
    echo "  (perf recorded no samples: run as root, or with kernel.perf_event_paranoid at 1 or below)"
    return 0
  fi
  echo "  where the server CPU a request went, µs (perf samples, kernel and user):"
  awk -F'\t' -v heads="${heads[*]}" '
    FNR == 1 { f++ }
    { v[$1, f] = $2; seen[$1] = 1 }
    END {
      n = split(heads, h, " ")
      printf "    %-50s", "part"
      for (i = 1; i <= n; i++) printf " %10s", h[i]
      printf "\n"
      m = 0
      for (p in seen) names[++m] = p
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (names[j] < names[i]) { t = names[i]; names[i] = names[j]; names[j] = t }
      for (i = 1; i <= m; i++) {
        printf "    %-50s", names[i]
        for (j = 1; j <= n; j++) printf " %10.2f", v[names[i], j] + 0
        printf "\n"
      }
    }' "${files[@]}"
}

# wrk_row NAME PID URL [LUA]: wrk for secs seconds, one thread, conns
# connections; requests counted from wrk's summary.
wrk_row() {
  local name=$1 pid=$2 url=$3 lua=${4:-}
  local args=(-t1 -c"$conns" -d"${secs}s" --latency)
  [ -n "$lua" ] && args+=(-s "$lua")
  local t0 t1 out n
  t0=$(cpu_ticks "$pid")
  timed "$work/wrk.out" wrk "${args[@]}" "$url" -- "$$-$RANDOM-$RANDOM"
  t1=$(cpu_ticks "$pid")
  out=$(cat "$work/wrk.out")
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  if echo "$out" | grep -q "Non-2xx"; then
    echo "$out" | grep "Non-2xx" | sed "s/^/    $name: /"
  fi
  row "$name" "$pid" "$n" "$t0" "$t1" "$secs" "$client_cpu"
}

deduct_lua "$work/deduct.lua"

batch_lua "$work/batch.lua"

if [ ${#server_pin[@]} -gt 0 ]; then
  echo "rows of ${secs}s, ${conns} connections, one client thread, ${rounds} rounds; servers on CPU $last, clients on CPU 0-$((last - 1))"
else
  echo "rows of ${secs}s, ${conns} connections, one client thread, ${rounds} rounds; $(nproc) cores shared by client and server"
fi

# Every server starts once and stays up; each round measures them all
# back to back, so that a neighbour's load on the shared host shows in the
# round it fell in, and each ratio compares rows of one round.

# The HTTP floor: stockd's no-op fasthttp server.
noop_port=$(free_port)
${server_pin[@]+"${server_pin[@]}"} "$bin" noop-server -http "127.0.0.1:$noop_port" >"$work/noop.log" 2>&1 &
noop_pid=$!; pids+=("$noop_pid")
wait_port "$noop_port"

# One stockd node with default flags.
start_node "$bin" "$work/data" "$work/stockd.log"
pids+=("$node_pid")
node_url=$url
curl -sf -X PUT "$node_url/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null
curl -sf -X PUT "$node_url/v1/skus/gone" -d '{"total":0}' >/dev/null

# The same with -http-event-loop=false: fasthttp serves every request.
main_pid=$node_pid
start_node "$bin" "$work/fast-data" "$work/fast.log" -http-event-loop=false
pids+=("$node_pid")
alt_pid=$node_pid; alt_url=$url
node_pid=$main_pid
curl -sf -X PUT "$alt_url/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null
curl -sf -X PUT "$alt_url/v1/skus/gone" -d '{"total":0}' >/dev/null

# The same with -procs 1.
start_node "$bin" "$work/one-data" "$work/one.log" -procs 1
pids+=("$node_pid")
one_pid=$node_pid; one_url=$url
node_pid=$main_pid
curl -sf -X PUT "$one_url/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null

# Redis + Lua, appendfsync always.
redis_port=$(free_port)
mkdir -p "$work/redis"
${server_pin[@]+"${server_pin[@]}"} redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" \
  --appendonly yes --appendfsync always --save "" --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!; pids+=("$redis_pid")
wait_port "$redis_port"
rc() { redis-cli -p "$redis_port" "$@"; }
script=$(cat <<'EOF'
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 2 end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local q = tonumber(ARGV[1])
if n < q then return 0 end
redis.call('DECRBY', KEYS[1], q)
redis.call('INCRBY', KEYS[3], q)
redis.call('HSET', KEYS[2], ARGV[2], q)
return 1
EOF
)
sha=$(rc SCRIPT LOAD "$script")
rc SET stock 1000000000 >/dev/null
# redis_calls COMMAND: the calls of COMMAND (evalsha, ping) Redis has
# answered.
redis_calls() { rc INFO commandstats | tr -d '\r' | awk -F'[=,:]' -v c="cmdstat_$1" '$1 == c {print $3}'; }

# redis_row NAME PIPELINE [ping]: redis-benchmark for secs seconds,
# stopped by SIGINT, sending the Lua deduct (or PING); the calls are
# counted from Redis's own command stats.
redis_row() {
  local name=$1 pipe=$2 cmd=${3:-evalsha} t0 t1 c0 c1 start end
  local call=(EVALSHA "$sha" 3 stock reqs sold 1 "req:__rand_int__")
  [ "$cmd" = ping ] && call=(PING)
  c0=$(redis_calls "$cmd"); c0=${c0:-0}
  t0=$(cpu_ticks "$redis_pid"); start=$(date +%s.%N)
  timed /dev/null timeout -s INT "$secs" redis-benchmark -p "$redis_port" -c "$conns" -n 2000000000 -P "$pipe" -r 1000000000 -q "${call[@]}"
  end=$(date +%s.%N); t1=$(cpu_ticks "$redis_pid")
  c1=$(redis_calls "$cmd"); c1=${c1:-0}
  row "$name" "$redis_pid" "$((c1 - c0))" "$t0" "$t1" "$(echo "$end - $start" | bc -l)" "$client_cpu"
}


# machine_line: what a syscall (getppid) and a round trip over a pipe
# between two processes (two context switches, two writes, two reads)
# cost now, from perf's own benchmarks; empty without perf.
machine_line() {
  command -v perf >/dev/null 2>&1 || return 0
  local sc pp
  sc=$(perf bench syscall basic -l 500000 2>/dev/null | awk '/usecs\/op/ {print $1}')
  pp=$(perf bench sched pipe -l 20000 2>/dev/null | awk '/usecs\/op/ {print $1}')
  [ -n "$sc" ] && [ -n "$pp" ] || return 0
  awk -v sc="$sc" -v pp="$pp" 'BEGIN {printf "a syscall %.2f µs, a pipe round trip between two processes %.1f µs (perf bench)", sc, pp}'
}
command -v perf >/dev/null 2>&1 || echo "(perf is not installed: the rounds do not say what a syscall and a context switch cost here; Debian package linux-perf)"

summary=()
for round in $(seq 1 "$rounds"); do
  echo "round $round"
  machine=$(machine_line)
  [ -n "$machine" ] && echo "  this machine now: $machine"
  wrk_row "no-op HTTP server (wrk)" "$noop_pid" "http://127.0.0.1:$noop_port/"
  noop_cpu=$cpu
  # The same server sent the deduct's own request (POST, JSON body, the
  # same script): the floor of reading that request and answering it,
  # which a sold-out answer is measured against.
  parts_tag=no-op parts_pid=$noop_pid wrk_row "no-op HTTP server, a deduct's request (wrk)" "$noop_pid" "http://127.0.0.1:$noop_port/v1/skus/gone/deduct" "$work/deduct.lua"
  noop_post_cpu=$cpu
  settle "$node_url"
  wrk_row "stockd sold-out answers (wrk)" "$node_pid" "$node_url/v1/skus/gone/deduct" "$work/deduct.lua"
  sold_cpu=$cpu
  settle "$node_url"
  # The same wins answered at once (wait=none: 202 after the stock CAS,
  # committed right after): what a win costs without waiting for its
  # durable write, so that the commit row splits into the two.
  wrk_row "stockd wait=none, every deduct wins (wrk)" "$node_pid" "$node_url/v1/skus/plenty/deduct?wait=none" "$work/deduct.lua"
  none_cpu=$cpu
  settle "$node_url"
  parts_tag=commit parts_pid=$node_pid wrk_row "stockd wait=commit, every deduct wins (wrk)" "$node_pid" "$node_url/v1/skus/plenty/deduct" "$work/deduct.lua"
  commit_cpu=$cpu; commit_rate=$rate
  t0=$(cpu_ticks "$node_pid"); settle "$node_url"; t1=$(cpu_ticks "$node_pid")
  echo "    writing the ledger file behind those wins took $(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN {printf "%.2f", (b - a) / hz}') s of the node's CPU more"
  # Redis + Lua right after the committed deducts, and Redis pipelined
  # right after the batch route: each rate ratio compares rows measured
  # seconds apart, not a minute, on a host whose load drifts.
  parts_tag=redis-lua parts_pid=$redis_pid redis_row "Redis + Lua, appendfsync always, pipeline 1" 1
  redis1_rate=$rate; redis1_cpu=$cpu
  parts_tag=redis-ping parts_pid=$redis_pid redis_row "Redis PING, its floor, pipeline 1" 1 ping
  ping_cpu=$cpu
  settle "$one_url"
  wrk_row "stockd -procs 1 wait=commit, wins (wrk)" "$one_pid" "$one_url/v1/skus/plenty/deduct" "$work/deduct.lua"
  one_cpu=$cpu; one_rate=$rate
  settle "$alt_url"
  wrk_row "stockd -http-event-loop=false sold-out answers (wrk)" "$alt_pid" "$alt_url/v1/skus/gone/deduct" "$work/deduct.lua"
  alt_sold_cpu=$cpu
  settle "$alt_url"
  wrk_row "stockd -http-event-loop=false wait=commit, wins (wrk)" "$alt_pid" "$alt_url/v1/skus/plenty/deduct" "$work/deduct.lua"
  alt_commit_cpu=$cpu; alt_commit_rate=$rate
  settle "$alt_url"
  # The batch route, 100 buyers a request: a request answers 200 even
  # when some of its buyers are refused (rate_limited at many connections),
  # so the units counted are the node's committed wins, from its metrics.
  w0=$(committed_deducts "$node_url"); t0=$(cpu_ticks "$node_pid")
  timed "$work/wrk.out" wrk -t1 -c"$conns" -d"${secs}s" -s "$work/batch.lua" "$node_url/v1/deducts" -- "$$-$RANDOM-$RANDOM"
  settle "$node_url"
  t1=$(cpu_ticks "$node_pid"); w1=$(committed_deducts "$node_url")
  sent=$(awk '/requests in/ {print $1 * 100}' "$work/wrk.out")
  [ "$((w1 - w0))" -lt "$sent" ] && echo "    of the $sent buyers the batch requests carried, $((sent - w1 + w0)) were not sold a unit"
  row "stockd POST /v1/deducts, 100 a request (units)" "$node_pid" "$((w1 - w0))" "$t0" "$t1" "$secs" "$client_cpu"
  batch_rate=$rate
  redis_row "Redis + Lua, appendfsync always, pipeline 100" 100
  redis100_rate=$rate
  line=$(awk -v nc="$noop_cpu" -v npc="$noop_post_cpu" -v sc="$sold_cpu" -v cc="$commit_cpu" -v cr="$commit_rate" -v nn="$none_cpu" \
    -v r1="$redis1_rate" -v rc1="$redis1_cpu" -v br="$batch_rate" -v r100="$redis100_rate" -v pc="$ping_cpu" 'function q(a, b) { return b > 0 ? a / b : 0 }
    BEGIN { printf "sold-out %.2fx the no-op CPU for the same request (%.2fx for a GET), commit %.2fx the no-op CPU (wait=none %.2fx) and %.2fx Redis + Lua CPU, commit rate %.2fx Redis + Lua, batch %.2fx Redis pipelined; above its floor a committed deduct costs %.1f µs (commit - no-op, same request), Redis + Lua %.1f µs (- PING)",
      q(sc, npc), q(sc, nc), q(cc, nc), q(nn, nc), q(cc, rc1), q(cr, r1), q(br, r100), cc - npc, rc1 - pc }')
  line="$line; -http-event-loop=false: $(awk -v npc="$noop_post_cpu" -v nc="$noop_cpu" -v sc="$alt_sold_cpu" -v cc="$alt_commit_cpu" -v cr="$alt_commit_rate" -v r1="$redis1_rate" -v rc1="$redis1_cpu" 'function q(a, b) { return b > 0 ? a / b : 0 }
    BEGIN { printf "sold-out %.2fx the no-op CPU for the same request, commit %.2fx the no-op CPU and %.2fx Redis + Lua CPU, commit rate %.2fx Redis + Lua", q(sc, npc), q(cc, nc), q(cc, rc1), q(cr, r1) }')"
  line="$line; -procs 1: commit $(awk -v c="$one_cpu" -v r="$one_rate" -v rc1="$redis1_cpu" -v r1="$redis1_rate" 'function q(a, b) { return b > 0 ? a / b : 0 }
    BEGIN { printf "%.1f µs, %.2fx Redis + Lua CPU, rate %.2fx Redis + Lua", c, q(c, rc1), q(r, r1) }')"
  [ -n "$machine" ] && line="$line; $machine"
  # The bars' four ratios, for the medians over rounds at the end.
  awk -v nc="$noop_cpu" -v npc="$noop_post_cpu" -v sc="$sold_cpu" -v cc="$commit_cpu" -v cr="$commit_rate" \
    -v r1="$redis1_rate" -v br="$batch_rate" -v r100="$redis100_rate" 'function q(a, b) { return b > 0 ? a / b : 0 }
    BEGIN { printf "%.4f %.4f %.4f %.4f\n", q(sc, npc), q(cc, nc), q(cr, r1), q(br, r100) }' >>"$work/ratios"
  awk -v c="$commit_cpu" -v oc="$one_cpu" -v rc1="$redis1_cpu" 'function q(a, b) { return b > 0 ? a / b : 0 }
    BEGIN { printf "%.4f %.4f\n", q(c, rc1), q(oc, rc1) }' >>"$work/cpu-ratios"
  echo "  round $round: $line"
  summary+=("round $round: $line")
  if [ -n "$parts" ]; then parts_table "no-op:$noop_post_cpu" "commit:$commit_cpu" "redis-lua:$redis1_cpu" "redis-ping:$ping_cpu"; fi
done

audit=$(curl -sf "$node_url/v1/skus/plenty/audit")
echo "stockd audit of the winning sale: $(echo "$audit" | tr -d '\n' | cut -c1-160)"
audit=$(curl -sf "$one_url/v1/skus/plenty/audit")
echo "the -procs 1 node's audit: $(echo "$audit" | tr -d '\n' | cut -c1-160)"
audit=$(curl -sf "$alt_url/v1/skus/plenty/audit")
echo "the -http-event-loop=false node's audit: $(echo "$audit" | tr -d '\n' | cut -c1-160)"
echo "Redis sold $(( 1000000000 - $(rc GET stock) )) units"
echo "each round's ratios (the bars: sold-out at most 1.20x the no-op for the same request, commit at most 2.57x the no-op's GET (18 µs on a 7 µs floor), commit rate at least 1.00x Redis + Lua, batch at least 1.50x Redis pipelined):"
for l in "${summary[@]}"; do echo "  $l"; done
# median COLUMN [FILE]: the median over rounds of one of the bars'
# ratios (FILE: $work/ratios).
median() {
  cut -d' ' -f"$1" "${2:-$work/ratios}" | sort -g | awk '{a[NR] = $1} END {printf "%.2f", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
# met COLUMN OP LIMIT [FILE]: how many rounds met that bar.
met() {
  cut -d' ' -f"$1" "${4:-$work/ratios}" | awk -v op="$2" -v lim="$3" '(op == "le" && $1 <= lim) || (op == "ge" && $1 >= lim) {n++} END {print n + 0}'
}
echo "server CPU a committed deduct against Redis + Lua's (at most 1.00x): default node, median $(median 1 "$work/cpu-ratios")x in $(met 1 le 1.0 "$work/cpu-ratios") of $rounds rounds; -procs 1, median $(median 2 "$work/cpu-ratios")x in $(met 2 le 1.0 "$work/cpu-ratios") of $rounds rounds"
echo "medians over the $rounds rounds (rounds that met the bar): sold-out $(median 1)x the no-op for the same request ($(met 1 le 1.2)), commit $(median 2)x the no-op's GET ($(met 2 le 2.57)), commit rate $(median 3)x Redis + Lua ($(met 3 ge 1.0)), batch $(median 4)x Redis pipelined ($(met 4 ge 1.5))"
