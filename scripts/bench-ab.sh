#!/usr/bin/env bash
# Two (or more) stockd binaries side by side, in alternated rows: each
# binary runs one node with default flags, and every round drives each
# node in turn with wrk for the same time and connections, so that a
# neighbour's load on a shared host falls on both alike. Each row gives
# the rate, the node's CPU per deduct (utime + stime from /proc/<pid>/stat)
# and the wins a raft entry carried; the end prints each binary's medians
# and in how many rounds it used less CPU than the first binary.
#
#   scripts/bench-ab.sh [-r rounds] [-s seconds] [-c connections] [-w commit|soldout] [-n 1|3] BIN...
#
# -n 3 runs each binary as a three-node cluster instead and drives a
# follower: the CPU per deduct is then summed over the three processes
# (a follower's sold-out answer may cost the leader a read index now and
# then), and the sales are created through the leader.
#
# -c takes a comma-separated list: every round then runs each node at
# each load, which gives CPU per deduct against the wins an entry
# carries. Installs
# wrk from Debian packages when missing; stops the nodes through their
# PIDs.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

rounds=5 secs=5 conns=64 what=commit nodes=1
while getopts "r:s:c:w:n:" o; do
  case $o in
    r) rounds=$OPTARG ;;
    s) secs=$OPTARG ;;
    c) conns=$OPTARG ;;
    w) what=$OPTARG ;;
    n) nodes=$OPTARG ;;
    *) echo "usage: $0 [-r rounds] [-s seconds] [-c conns[,conns...]] [-w commit|soldout] [-n 1|3] BIN..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r rounds] [-s seconds] [-c conns] [-w commit|soldout] [-n 1|3] BIN..." >&2; exit 2; }
case $nodes in 1|3) ;; *) echo "-n: 1 or 3, not $nodes" >&2; exit 2 ;; esac
case $what in
  commit) sku=plenty ;;
  soldout) sku=gone ;;
  *) echo "-w: commit or soldout, not $what" >&2; exit 2 ;;
esac
need_cmds wrk:wrk

start_work ab
deduct_lua "$work/deduct.lua"
hz=$(getconf CLK_TCK)

# urls[i] is where binary i's load goes; procs[i] the PIDs whose CPU counts.
urls=() procs=()
for i in $(seq 1 $#); do
  if [ "$nodes" = 3 ]; then
    start_cluster "${!i}" "$work/cluster$i"
    admin=$leader_url url=$follower_url
    procs+=("${cluster_pids[*]}")
  else
    start_node "${!i}" "$work/data$i" "$work/node$i.log"
    pids+=("$node_pid"); procs+=("$node_pid")
    admin=$url
  fi
  urls+=("$url")
  curl -sf -X PUT "$admin/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null
  curl -sf -X PUT "$admin/v1/skus/gone" -d '{"total":0}' >/dev/null
  for _ in $(seq 1 100); do curl -sf "$url/v1/skus/gone" >/dev/null && break; sleep 0.05; done
done

entries() { curl -sf "$1/metrics" | awk '$1 == "stockd_take_commit_seconds_count" {printf "%.0f", $2}'; }
# ticks PIDS...: their CPU ticks summed.
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }

echo "$what deducts, rows of ${secs}s, connections $conns, $rounds rounds, $nodes node(s) a binary, binaries: $*"
printf "%-5s %-3s %-6s %10s %12s %12s\n" round bin conns "deducts/s" "µs/deduct" "wins/entry"
for r in $(seq 1 "$rounds"); do
  for c in ${conns//,/ }; do
    for i in $(seq 0 $(($# - 1))); do
      u=${urls[$i]} p=${procs[$i]}
      settle "$u"
      e0=$(entries "$u"); t0=$(ticks $p)
      n=$(wrk -t1 -c"$c" -d"${secs}s" -s "$work/deduct.lua" "$u/v1/skus/$sku/deduct" -- "ab$r-$i-$c-$RANDOM" | awk '/requests in/ {print $1}')
      t1=$(ticks $p); e1=$(entries "$u")
      awk -v r="$r" -v b="$((i + 1))" -v c="$c" -v n="$n" -v s="$secs" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v e="$((e1 - e0))" \
        'BEGIN { w = e > 0 ? sprintf("%.1f", n / e) : "-"; printf "%-5s %-3s %-6s %10.0f %12.2f %12s\n", r, b, c, n / s, (t1 - t0) / hz * 1e6 / n, w }'
    done
  done
done | tee "$work/rows"

echo "medians (and rounds with less CPU than binary 1 at the same load):"
for c in ${conns//,/ }; do
  for i in $(seq 1 $#); do
    awk -v b="$i" -v c="$c" -v name="${!i}" '
      $2 == 1 && $3 == c { base[$1] = $5 }
      $2 == b && $3 == c { rate[++n] = $4; cpu[n] = $5; row[n] = $1 }
      function median(a, k,   i, j, t) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
      END {
        less = 0; for (i = 1; i <= n; i++) if (cpu[i] < base[row[i]]) less++
        printf "  %-40s %4s conns: %8.0f deducts/s  %6.2f µs a deduct", name, c, median(rate, n), median(cpu, n)
        if (b > 1) printf "  (less CPU in %d of %d rounds)", less, n
        printf "\n" }' "$work/rows"
  done
done
