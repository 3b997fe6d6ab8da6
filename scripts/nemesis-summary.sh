#!/usr/bin/env bash
# Filters `go test -v -run Nemesis` output down to what a person reads: the
# schedules that failed (with their errors and replay commands) and the
# summary line; the whole output goes to nemesis.log. Exits non-zero when
# the tests failed.
set -uo pipefail
log=${NEMESIS_LOG:-nemesis.log}
tee "$log" | grep -E --line-buffered '^(--- FAIL|    --- FAIL|FAIL|ok )|nemesis summary|replay: |not linearizable|oversold|want |differ|timed out' 
status=0
grep -qE '^(FAIL|--- FAIL)' "$log" && status=1
grep -qE '^ok ' "$log" || status=1
echo "full output: $log"
exit $status
