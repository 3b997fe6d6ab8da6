#!/usr/bin/env bash
# Filters `go test -v -run Nemesis` output down to what a person reads: the
# schedules that failed (with their errors and replay commands) and the
# summary line; the whole output goes to nemesis.log. Exits non-zero when
# the tests failed. For each failed schedule it then prints that
# schedule's own lines from the test (its faults, phases and errors, not
# the nodes' logs), so that a CI log that keeps only the tail still says
# what went wrong.
set -uo pipefail
log=${NEMESIS_LOG:-nemesis.log}
tee "$log" | grep -E --line-buffered '^(--- FAIL|    --- FAIL|FAIL|ok )|nemesis summary|replay: |not linearizable|oversold|want |differ|timed out|without a final answer|not ready'
status=0
grep -qE '^(FAIL|--- FAIL)' "$log" && status=1
grep -qE '^ok ' "$log" || status=1
for run in $(grep -oE '^    --- FAIL: TestNemesis/[^ ]+' "$log" | sed 's/.*FAIL: //'); do
	echo "--- what $run did (its test lines; the nodes' logs are in $log):"
	awk -v run="$run" '
		/^=== (RUN|CONT|NAME) / { in_run = ($3 == run); shown = 0; next }
		!in_run { next }
		/^    [a-z_]+_test\.go:[0-9]+: / { print; shown = 1; next }
		shown && /^        / { print; next }  # the further lines of a message
		{ shown = 0 }
	' "$log"
done
echo "full output: $log"
exit $status
