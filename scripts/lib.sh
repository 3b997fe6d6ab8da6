# Helpers the bench scripts share; source it: . "$(dirname "$0")/lib.sh"

# free_port: a free loopback port (nothing answers on it), outside the
# kernel's ephemeral range, by the rule internal/loopport follows: a port
# in that range can be taken at any moment as the local end of some
# client's connection (a bench's), and a listener then fails to bind it.
# Below the range when it leaves 2,000 ports above 10000, else above it;
# else anywhere from 10000 (with a warning).
free_port() {
  local p lo hi from to
  read -r lo hi 2>/dev/null < /proc/sys/net/ipv4/ip_local_port_range || { lo=32768; hi=60999; }
  if [ "${lo:-0}" -ge 12000 ]; then
    from=10000 to=$((lo - 1))
  elif [ "${hi:-65535}" -le 63535 ]; then
    from=$((hi + 1)) to=65535
  else
    echo "free_port: the ephemeral range $lo-$hi leaves no room outside it; a port may be taken before it is bound" >&2
    from=10000 to=65535
  fi
  for _ in $(seq 1 200); do
    p=$(( from + (RANDOM * 32768 + RANDOM) % (to - from + 1) ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  echo "no free port found in $from-$to" >&2; exit 1
}

# wait_port PORT: wait (up to ten seconds) until something listens on
# 127.0.0.1:PORT, or fail.
wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.05
  done
  echo "nothing listens on 127.0.0.1:$1" >&2; exit 1
}

# cpu_ticks PID: the process's utime + stime, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# committed_deducts URL: the deducts the stockd node at URL has answered
# ok (committed wins), from its metrics.
committed_deducts() { curl -sf "$1/metrics" | awk '$1 == "stockd_deducts_total{outcome=\"ok\"}" {printf "%.0f", $2}'; }

# settle URL: wait (up to a minute) until the stockd node at URL has
# written its ledger file behind the log, so that the next measurement is
# not charged for the one before.
settle() {
  local lag
  for _ in $(seq 1 600); do
    lag=$(curl -sf "$1/metrics" | awk '$1 == "stockd_ledger_persist_lag_entries" || $1 == "stockd_ledger_pending_changes" {s += $2} END {print s + 0}')
    [ "$lag" = "0" ] && return
    sleep 0.1
  done
}

# need_cmds CMD:PACKAGE...: installs from Debian packages the packages of
# the commands that are missing.
need_cmds() {
  local missing=() c
  for c in "$@"; do
    command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing ${missing[*]} from Debian packages"
  local sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
}

# start_work NAME: a new temporary directory in $work and an empty pids
# array; on exit, every PID in pids is stopped (stop_pid) and the
# directory removed.
start_work() {
  work=$(mktemp -d "/tmp/stockd-$1-XXXXXX")
  pids=()
  trap cleanup_work EXIT
}

cleanup_work() {
  for p in "${pids[@]}"; do stop_pid "$p"; done
  rm -rf "$work"
}

# stop_pid PID: SIGTERM, up to 20 s to exit, then SIGKILL.
stop_pid() {
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1"
  for _ in $(seq 1 200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

# start_node BIN DATA_DIR LOG [serve flags...]: one stockd node with
# default flags on free loopback ports, started through the command in the
# array server_pin when set (taskset -c CPUS); sets node_pid and url, and
# returns once it is ready (or fails after ten seconds).
start_node() {
  local bin=$1 data=$2 log=$3 http_port raft_port
  shift 3
  http_port=$(free_port); raft_port=$(free_port)
  url="http://127.0.0.1:$http_port"
  ${server_pin[@]+"${server_pin[@]}"} "$bin" serve -http "127.0.0.1:$http_port" -raft "127.0.0.1:$raft_port" -data "$data" -log-level warn "$@" >"$log" 2>&1 &
  node_pid=$!
  for _ in $(seq 1 200); do
    curl -sf "$url/readyz" >/dev/null 2>&1 && return
    sleep 0.05
  done
  echo "the node at $url was not ready in 10 s; its log ($log):" >&2
  tail -20 "$log" >&2
  exit 1
}

# wrk_lua_prelude: the start of a wrk script that POSTs JSON, with a
# counter and the prefix from wrk's command line (`-- PREFIX`) for
# unique ids; the script's request function follows it.
wrk_lua_prelude() {
  cat <<'LUA'
local counter = 0
local prefix = "x"
function init(args) prefix = args[1] or prefix end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
LUA
}

# deduct_lua FILE: a wrk script that POSTs one deduct a request, each
# with its own user and request id (per wrk thread and counter), to the
# sale in the URL's path. The prefix comes from wrk's command line
# (`-- PREFIX`): wrk's Lua random numbers start from the same seed in
# every run.
deduct_lua() {
  wrk_lua_prelude >"$1"
  cat >>"$1" <<'LUA'
request = function()
  counter = counter + 1
  local body = string.format('{"user":"u%s-%d","qty":1,"request_id":"r%s-%d"}', prefix, counter, prefix, counter)
  return wrk.format(nil, nil, nil, body)
end
LUA
}

# batch_lua FILE: a wrk script that POSTs a batch of 100 buyers a request
# (POST /v1/deducts) to sale "plenty", each with its own user and request
# id (the prefix from wrk's command line, as deduct_lua's).
batch_lua() {
  wrk_lua_prelude >"$1"
  cat >>"$1" <<'LUA'
request = function()
  local items = {}
  for i = 1, 100 do
    counter = counter + 1
    items[i] = string.format('{"sku":"plenty","user":"b%s-%d","qty":1,"request_id":"rb%s-%d"}', prefix, counter, prefix, counter)
  end
  return wrk.format(nil, nil, nil, '{"deducts":[' .. table.concat(items, ",") .. ']}')
end
LUA
}

# start_cluster BIN DIR [serve flags...]: three stockd nodes n1..n3 on
# free loopback ports (a cluster secret between them), data and logs
# under DIR; appends their PIDs to pids (stopped on exit), sets
# cluster_pids (n1 n2 n3), leader_url and follower_url (a follower's),
# and returns once every node is ready and a sale created through the
# leader reads the same on the follower.
start_cluster() {
  local bin=$1 dir=$2 i peers="" id leader
  shift 2
  local http=() raft=()
  for i in 1 2 3; do http+=("$(free_port)"); raft+=("$(free_port)"); done
  for i in 1 2 3; do peers="$peers${peers:+,}n$i=127.0.0.1:${raft[$((i - 1))]}"; done
  cluster_pids=() cluster_urls=()
  mkdir -p "$dir"
  for i in 1 2 3; do
    ${server_pin[@]+"${server_pin[@]}"} "$bin" serve -id "n$i" -http "127.0.0.1:${http[$((i - 1))]}" -raft "127.0.0.1:${raft[$((i - 1))]}" \
      -data "$dir/n$i" -peers "$peers" -cluster-secret bench-ab -log-level warn "$@" >"$dir/n$i.log" 2>&1 &
    cluster_pids+=("$!"); pids+=("$!")
    cluster_urls+=("http://127.0.0.1:${http[$((i - 1))]}")
  done
  for i in 0 1 2; do
    for _ in $(seq 1 300); do
      curl -sf "${cluster_urls[$i]}/readyz" >/dev/null 2>&1 && break
      sleep 0.05
    done
    curl -sf "${cluster_urls[$i]}/readyz" >/dev/null || { echo "n$((i + 1)) of the cluster in $dir was not ready in 15 s" >&2; tail -20 "$dir/n$((i + 1)).log" >&2; exit 1; }
  done
  leader=$(curl -sf "${cluster_urls[0]}/v1/cluster" | sed -n 's/.*"leader":"\([^"]*\)".*/\1/p')
  for i in 1 2 3; do
    id="n$i"
    if [ "$id" = "$leader" ]; then leader_url=${cluster_urls[$((i - 1))]}; else follower_url=${cluster_urls[$((i - 1))]}; fi
  done
  [ -n "${leader_url:-}" ] && [ -n "${follower_url:-}" ] || { echo "no leader found in the cluster in $dir" >&2; exit 1; }
}
