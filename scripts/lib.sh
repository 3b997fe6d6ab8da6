# Helpers the bench scripts share; source it: . "$(dirname "$0")/lib.sh"

# free_port: a free loopback port (nothing answers on it).
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  echo "no free port found" >&2; exit 1
}

# cpu_ticks PID: the process's utime + stime, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

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
