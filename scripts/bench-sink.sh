#!/usr/bin/env bash
# The sink's throughput and lag, into PostgreSQL and into MariaDB, each with
# its durable defaults (PostgreSQL fsync and synchronous_commit on; MariaDB
# innodb_flush_log_at_trx_commit=1). For each database, on a fresh
# three-node cluster on loopback:
#
#   live:     the sink runs while `stockd bench -strategy stockd-batch` sells
#             REQUESTS orders through POST /v1/deducts; its lag (events and
#             seconds, from its -metrics) is sampled every 0.5 s, and the
#             time from the bench's end until the table holds every order.
#   backlog:  a second sink, on a table of its own, started once the sale is
#             over, writes the whole feed: events per second, and the CPU
#             the sink and the database spent an event (from /proc); beside
#             it, in the same run, `stockd feed` reading the whole feed into
#             /dev/null (the rate of a consumer that writes nothing).
#
# Installs postgresql and mariadb-server from Debian packages when missing;
# starts every process in a temp dir and stops each through its own PID.
#
#   scripts/bench-sink.sh [binary] [requests]     (defaults: bin/stockd 200000)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=$(realpath "${1:-bin/stockd}")
requests=${2:-200000}

need_apt=()
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || need_apt+=(postgresql)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} from Debian packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
mariadbd=$(command -v mariadbd || echo /usr/sbin/mariadbd)

work=$(mktemp -d /tmp/stockd-sinkbench-XXXXXX)
chmod 755 "$work"
pids=()
pg_started=""
cleanup() {
  for p in "${pids[@]}"; do stop_pid "$p"; done
  if [ -n "$pg_started" ]; then
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- the databases
pg_port=$(free_port)
mkdir -p "$work/pg" && chown postgres "$work/pg"
runuser -u postgres -- "$pgbin/initdb" -D "$work/pg" --auth=trust -U postgres >"$work/initdb.log" 2>&1
runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1" start >/dev/null
pg_started=1
pg_dsn="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
pg_pid=$(head -n 1 "$work/pg/postmaster.pid")

mkdir -p "$work/maria" && chown mysql "$work/maria"
mariadb-install-db --no-defaults --datadir="$work/maria/data" --user=mysql --auth-root-authentication-method=normal --skip-test-db >"$work/maria-install.log" 2>&1
"$mariadbd" --no-defaults --datadir="$work/maria/data" --socket="$work/maria/sock" --port="$(free_port)" --bind-address=127.0.0.1 \
  --user=mysql --log-error="$work/maria/error.log" --innodb-buffer-pool-size=256M 2>/dev/null &
maria_pid=$!
pids+=("$maria_pid")
for _ in $(seq 1 300); do [ -S "$work/maria/sock" ] && break; sleep 0.1; done
for _ in $(seq 1 100); do mariadb --socket="$work/maria/sock" -u root -e "CREATE DATABASE IF NOT EXISTS stockd" 2>/dev/null && break; sleep 0.1; done
maria_dsn="mysql://root@localhost/stockd?socket=$work/maria/sock"

# db_ticks KIND: the database server's utime + stime (PostgreSQL: the
# postmaster, the backends that ended (its children's times) and those
# still running).
db_ticks() {
  if [ "$1" = postgres ]; then
    local t p
    t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pg_pid/stat")
    for p in $(ps -o pid= --ppid "$pg_pid"); do t=$((t + $(cpu_ticks "$p" 2>/dev/null || echo 0))); done
    echo "$t"
  else
    cpu_ticks "$maria_pid"
  fi
}

metric() { # metric PORT NAME
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}'
}

hz=$(getconf CLK_TCK)
lags=()
echo "| database | sale (batch route, 3 nodes) | live: max lag | caught up after the sale | backlog: events/s | of a reader that writes nothing | sink CPU/event | database CPU/event |"
echo "|---|---|---|---|---|---|---|---|"
for kind in postgres mariadb; do
  dsn=$pg_dsn
  [ "$kind" = mariadb ] && dsn=$maria_dsn
  # A fresh cluster, plain HTTP on loopback.
  cl="$work/cluster-$kind"
  start_cluster "$bin" "$cl"
  urls=$(IFS=,; echo "${cluster_urls[*]}")

  mport=$(free_port)
  "$bin" sink -target "$urls" -db "$dsn" -consumer live -metrics "127.0.0.1:$mport" -progress 10s 2>"$cl/sink-live.log" &
  sink_pid=$!; pids+=("$sink_pid")
  wait_port "$mport"
  maxlag=0 maxlag_s=0 series="" tick=0
  "$bin" bench -target "$urls" -strategy stockd-batch -scenario plentiful -requests "$requests" -duration 120s >"$cl/bench.log" 2>&1 &
  bench_pid=$!
  while kill -0 "$bench_pid" 2>/dev/null; do
    l=$(metric "$mport" stockd_sink_lag_events); s=$(metric "$mport" stockd_sink_lag_seconds)
    [ "${l:-0}" -gt "$maxlag" ] && maxlag=$l
    maxlag_s=$(awk -v a="$maxlag_s" -v b="${s:-0}" 'BEGIN {print (b > a) ? b : a}')
    [ $((tick % 4)) -eq 0 ] && series="$series $((tick / 2))s:${l:-0}"
    tick=$((tick + 1))
    sleep 0.5
  done
  wait "$bench_pid" || { cat "$cl/bench.log"; exit 1; }
  rate=$(awk '/^stockd-batch/ {for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) {print $i; exit}}' "$cl/bench.log")
  ended=$(date +%s.%N)
  head=$(curl -s "${cluster_urls[0]}/v1/consumers" | sed -n 's/.*"head":"[0-9]*-\([0-9]*\)".*/\1/p')
  for i in $(seq 1 1200); do
    c=$(metric "$mport" stockd_sink_cursor_seq)
    [ "${c:-0}" -ge "$head" ] && break
    [ $((i % 20)) -eq 0 ] && series="$series $(awk -v a="$ended" -v b="$(date +%s.%N)" -v t="$tick" 'BEGIN {printf "%d", t / 2 + b - a}')s:$((head - ${c:-0}))"
    sleep 0.1
  done
  caught=$(awk -v a="$ended" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f s", b - a}')
  stop_pid "$sink_pid"

  # The backlog: every event of the sale, into a table of its own.
  d0=$(db_ticks "$kind")
  t0=$(date +%s.%N)
  "$bin" sink -target "$urls" -db "$dsn" -consumer backlog -table backlog_orders -wait 0s -exit-when-idle -progress 0 2>"$cl/sink-backlog.log" &
  bpid=$!
  sink_ticks=0
  while kill -0 "$bpid" 2>/dev/null; do sink_ticks=$(cpu_ticks "$bpid" 2>/dev/null || echo "$sink_ticks"); sleep 0.2; done
  wait "$bpid" || { cat "$cl/sink-backlog.log"; exit 1; }
  t1=$(date +%s.%N)
  d1=$(db_ticks "$kind")
  events=$head
  r0=$(date +%s.%N)
  "$bin" feed -target "$urls" -consumer raw -from 0 -ack=false -limit 1000 -wait 0s -exit-when-idle >/dev/null 2>"$cl/feed.log"
  r1=$(date +%s.%N)
  awk -v k="$kind" -v sale="${rate:-?}" -v lag="$maxlag" -v lags="$maxlag_s" -v caught="$caught" -v ev="$events" -v t0="$t0" -v t1="$t1" \
      -v st="$sink_ticks" -v dt="$((d1 - d0))" -v hz="$hz" -v r0="$r0" -v r1="$r1" 'BEGIN {
    printf "| %s | %s deducts/s | %d events (%.1f s) | %s | %.0f (%d events in %.1f s) | %.2fx (%.0f/s) | %.1f µs | %.1f µs |\n",
      k, sale, lag, lags, caught, ev / (t1 - t0), ev, t1 - t0, (r1 - r0) / (t1 - t0), ev / (r1 - r0), st / hz / ev * 1e6, dt / hz / ev * 1e6 }'
  lags+=("$kind, lag in events every 2 s of the sale, then while it drains:$series")
  for p in "${cluster_pids[@]}"; do stop_pid "$p"; done
done
printf '%s\n' "${lags[@]}"
