#!/usr/bin/env bash
# Runs the bench's full comparison table with the Redis and PostgreSQL rows:
# installs redis-server and postgresql from Debian packages when missing,
# starts both on loopback in a temp dir (Redis with appendonly and
# appendfsync always, PostgreSQL with its durable defaults), runs
# `stockd bench`, and stops both through their own PIDs.
#
#   scripts/bench-peers.sh [binary] [extra bench flags...]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
shift || true
out=${BENCH_OUT:-.}

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || need_apt+=(postgresql)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} from Debian packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

work=$(mktemp -d /tmp/stockd-peers-XXXXXX)
redis_pid=""
pg_started=""
cleanup() {
  if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
    kill -TERM "$redis_pid"
    for _ in $(seq 1 100); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -n "$pg_started" ]; then
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT


redis_port=$(free_port)
mkdir -p "$work/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" \
  --appendonly yes --appendfsync always --save "" --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!

id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
pg_port=$(free_port)
mkdir -p "$work/pg" && chown postgres "$work" "$work/pg"
runuser -u postgres -- "$pgbin/initdb" -D "$work/pg" --auth=trust -U postgres >"$work/initdb.log" 2>&1
runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
pg_started=1

for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
  sleep 0.1
done

echo "redis on 127.0.0.1:$redis_port (appendfsync always), postgresql on 127.0.0.1:$pg_port"
"$bin" bench -launch 1 -scenario all \
  -redis "127.0.0.1:$redis_port" \
  -postgres "postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable" \
  -json "$out/bench-results.json" -html "$out/bench-report.html" "$@"
