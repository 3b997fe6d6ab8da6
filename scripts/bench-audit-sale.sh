#!/usr/bin/env bash
# The periodic audit coming due in the middle of a sale, on a large
# ledger. One node fills a ledger with ORDERS million orders (batches of
# 100 buyers a request, wrk) and restarts on it. A node audits when it
# starts, and that audit's duration sets when the next is due (a hundred
# times it later, or -audit-interval if longer); 40 s before then a sale
# of SECONDS of committed deducts starts (wrk, 64 connections, each
# deduct its own buyer and request id). Every half second the script
# reads the node's committed deducts and whether an audit has ended
# (stockd_audit_duration_seconds changed), and prints the rates with the
# audits' ends, so that a dip in the sale lines up with the audit that
# caused it; then the node's log lines about holding the audit back, and
# the sale's audit. A node that holds its audit back while it sells
# shows no dip, and its audit after the sale. Each line of about ten
# seconds ends with the node's CPU per committed deduct over it (from
# /proc) and its resident memory (its own, and the ledger file's mapped
# pages, and the major page faults it took over the line: pages read
# from disk), so that a slower stretch shows whether the node worked
# harder for each deduct or got less of the machine. At the restart,
# at the sale's start and after it, the script prints how much of the
# ledger file the page cache holds (fincore).
#
# PROFILES=DIR takes CPU profiles of the node into DIR: two of 20 s, one
# from +5 s of the sale and one ending 5 s before its end
# (go tool pprof -top -diff_base DIR/early.pprof BINARY DIR/late.pprof),
# and one of 20 s from 1 s after the sale, where a held audit runs
# (DIR/after.pprof).
#
# Needs about 250 bytes of disk a order (3 GB at 12 million) in /tmp, and
# takes the load time plus five to eight minutes. Installs wrk from
# Debian packages when missing; stops the node through its own PID.
#
#   scripts/bench-audit-sale.sh [binary] [orders, millions] [sale seconds]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bin=${1:-bin/stockd}
millions=${2:-12}
sale=${3:-100}
need_cmds wrk:wrk

start_work audit-sale
deduct_lua "$work/deduct.lua"
batch_lua "$work/batch.lua"

# in_cache: how much of the ledger file the kernel's page cache holds
# (an audit that finds it out of the cache reads it from disk).
in_cache() {
  if command -v fincore >/dev/null; then
    fincore -n -o RES,SIZE "$work/data/ledger.db" | awk '{printf "%s of %s of the ledger file in the page cache", $1, $2}'
  fi
  awk '$1 == "drop_pagecache" {printf " (the page cache dropped %d times since boot)", $2}' /proc/vmstat
  echo
}
audit_seconds() { curl -sf "$url/metrics" | awk '$1 == "stockd_audit_duration_seconds" {print $2}'; }

start_node "$bin" "$work/data" "$work/fill.log"
pids+=("$node_pid")
curl -sf -X PUT "$url/v1/skus/plenty" -d '{"total":1000000000}' >/dev/null
want=$((millions * 1000000))
echo "filling the ledger to $millions million orders (batches of 100, wrk)"
while [ "$(committed_deducts "$url")" -lt "$want" ]; do
  wrk -t1 -c64 -d20s -s "$work/batch.lua" "$url/v1/deducts" -- "b$$-$RANDOM" >/dev/null
done
settle "$url"
echo "the ledger holds $(committed_deducts "$url") orders ($(du -sh "$work/data" | cut -f1)); restarting the node on it"
stop_pid "$node_pid"

started=$(date +%s)
start_node "$bin" "$work/data" "$work/node.log" -log-level info
pids+=("$node_pid")
first=0
for _ in $(seq 1 600); do
  first=$(audit_seconds)
  [ "$first" != "0" ] && break
  sleep 0.5
done
due=$(awk -v d="$first" 'BEGIN {g = 100 * d; if (g < 30) g = 30; printf "%d", g}')
echo "the audit at start took ${first}s; the next is due about ${due}s after the start; $(in_cache)"
wait_until=$((started + due - 40))
while [ "$(date +%s)" -lt "$wait_until" ]; do sleep 1; done
echo "the sale starts; $(in_cache)"

profile() { sleep "$1"; curl -sf -o "$PROFILES/$2.pprof" "$url/debug/pprof/profile?seconds=20" || echo "no $2 profile"; }
if [ -n "${PROFILES:-}" ]; then
  mkdir -p "$PROFILES"
  profile 5 early & pids+=($!)
  profile $((sale - 25)) late & pids+=($!)
  profile $((sale + 1)) after & pids+=($!)
fi
# rss PID: the process's resident memory, its own (heap, stacks) apart
# from the ledger file's pages it maps (which the kernel can drop).
rss() { awk '/^RssAnon/ {a = $2} /^RssFile/ {f = $2} END {printf "resident %.0f MiB own, %.0f MiB of mapped files", a / 1024, f / 1024}' "/proc/$1/status"; }
# major_faults PID: the page faults the process has taken that read
# from disk.
major_faults() { awk '{print $12}' "/proc/$1/stat"; }

sale_start=$(date +%s.%N)
wrk -t1 -c64 -d"${sale}s" -s "$work/deduct.lua" "$url/v1/skus/plenty/deduct" -- "s$$-$RANDOM" >"$work/sale.out" &
sale_pid=$!
pids+=("$sale_pid")
# Each reading's rate is over the time since the one before, on the
# clock: the readings themselves take time, so the half second between
# them is a little more.
prev=$(committed_deducts "$url"); prev_t=$(date +%s.%N); last=$first; line=""; ends=(); from=0
win_deducts=$prev; win_ticks=$(cpu_ticks "$node_pid"); win_faults=$(major_faults "$node_pid")
for i in $(seq 1 $(( (sale + 60) * 2 ))); do
  sleep 0.5
  cur=$(committed_deducts "$url"); now=$(date +%s.%N)
  line="$line $(awk -v d=$((cur - prev)) -v a="$prev_t" -v b="$now" 'BEGIN {printf "%.0f", d / (b - a)}')"
  prev=$cur; prev_t=$now
  a=$(audit_seconds)
  at=$(awk -v s="$sale_start" -v n="$now" 'BEGIN {printf "%.1f", n - s}')
  if [ "$a" != "$last" ]; then
    ends+=("an audit of ${a}s ended at +${at}s"); last=$a
    line="$line [audit ended]"
  fi
  if [ $((i % 20)) -eq 0 ]; then
    ticks=$(cpu_ticks "$node_pid")
    cost=$(awk -v t=$((ticks - win_ticks)) -v d=$((cur - win_deducts)) -v hz="$(getconf CLK_TCK)" \
      'BEGIN {if (d > 0) printf "%.1f µs/deduct", t * 1e6 / hz / d; else printf "%.2f s of CPU, no deducts", t / hz}')
    faults=$(major_faults "$node_pid")
    printf "  +%5.1fs to +%5.1fs:%s | %s, %s, %d major faults\n" "$from" "$at" "$line" "$cost" "$(rss "$node_pid")" $((faults - win_faults))
    line=""; from=$at; win_deducts=$cur; win_ticks=$ticks; win_faults=$faults
  fi
done
wait "$sale_pid" || true
echo "the sale: $(awk '/requests in/ {print $1}' "$work/sale.out") committed deducts in ${sale}s (from +0s); above, deducts a second about every half second"
if [ ${#ends[@]} -eq 0 ]; then
  echo "no audit ended within 60 s after the sale"
else
  for e in "${ends[@]}"; do echo "  $e"; done
fi
grep -E "periodic audit" "$work/node.log" | sed 's/^/  node: /' || true
echo "after the sale; $(in_cache)"
curl -sf "$url/v1/skus/plenty/audit" | awk '{print "the sale'\''s audit: " substr($0, 1, 160)}'
