package scenario

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/node/nodetest"
)

// stallReport says what a schedule whose buyers ran out of time was
// stuck on, for a failure that a replay may not repeat: what the nodes
// answered the buyers last, each node's view of raft and readiness, and
// the goroutines that had waited a minute or more (the whole dump goes to
// a file; the log gets them grouped by where they wait).
func (h *nemesisHistory) stallReport(t *testing.T, c *nodetest.Cluster, seed uint64) {
	t.Helper()
	t.Logf("stall: the buyers' answers in the 10 s before they gave up:\n%s", h.lastAnswers(10*time.Second))
	for _, id := range c.IDs {
		cl, n := c.Client(id), c.Node(id)
		if cl == nil || n == nil {
			t.Logf("stall: %s is down", id)
			continue
		}
		stats := n.Raft().RaftStats()
		var raw []string
		for _, k := range []string{"state", "term", "last_log_index", "last_log_term", "commit_index", "applied_index", "fsm_pending", "last_snapshot_index", "last_contact", "latest_configuration"} {
			raw = append(raw, k+"="+stats[k])
		}
		t.Logf("stall: %s raft's own view: %s", id, strings.Join(raw, " "))
		code, ready := nodetest.CallWithin(cl, 3*time.Second, "GET", "/readyz", "")
		_, st := nodetest.CallWithin(cl, 3*time.Second, "GET", "/v1/cluster", "")
		t.Logf("stall: %s readyz %d %v; raft %v leader %v term %v commit %v applied %v ledger %v", id, code, ready,
			st["state"], st["leader"], st["term"], st["commit_index"], st["applied_index"], st["ledger_index"])
	}
	dump := goroutineDump()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("stockd-nemesis-%d-goroutines.txt", seed))
	if err := os.WriteFile(path, dump, 0o644); err != nil {
		t.Logf("stall: write the goroutine dump: %v", err)
	} else {
		t.Logf("stall: every goroutine's stack in %s", path)
	}
	t.Logf("stall: goroutines waiting a minute or more, by where they wait:\n%s", longWaits(dump, 12))
}

// lastAnswers counts the tv answers of calls made in the last span
// before the buyers gave up, by node and answer.
func (h *nemesisHistory) lastAnswers(span time.Duration) string {
	from := h.giveUp.Add(-span).Sub(h.start).Nanoseconds()
	h.mu.Lock()
	counts := map[string]int{}
	for _, tc := range h.tvCalls {
		if tc.call >= from {
			answer, _, _ := strings.Cut(tc.answer, " ") // the error code, not the order id or detail
			if tc.code == 200 {
				answer = "order"
			}
			counts[fmt.Sprintf("%s %d %s", tc.node, tc.code, answer)]++
		}
	}
	h.mu.Unlock()
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(&b, "  %s: %d\n", k, counts[k])
	}
	if b.Len() == 0 {
		return "  none"
	}
	return strings.TrimRight(b.String(), "\n")
}

func goroutineDump() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitHeader matches a goroutine's header that says it has waited
// minutes: "goroutine 12 [chan receive, 2 minutes]:".
var waitHeader = regexp.MustCompile(`^goroutine \d+ \[([^,\]]+)(?:, [^\]]*)?, (\d+) minutes?(?:, [^\]]*)?\]:$`)

// longWaits groups the goroutines of dump that have waited a minute or
// more by their state and innermost frame of this module, and returns the
// top groups with a count and that frame's stack.
func longWaits(dump []byte, top int) string {
	type group struct {
		n     int
		stack string
	}
	groups := map[string]*group{}
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		lines := strings.Split(strings.TrimSpace(string(g)), "\n")
		m := waitHeader.FindStringSubmatch(lines[0])
		if m == nil {
			continue
		}
		// Function lines alternate with file lines; keep the functions of
		// this module, innermost first.
		var ours []string
		for i := 1; i < len(lines); i += 2 {
			if fn := lines[i]; strings.HasPrefix(fn, "stockd.dev/") {
				if j := strings.LastIndex(fn, "("); j > 0 {
					fn = fn[:j]
				}
				ours = append(ours, fn)
			}
		}
		if len(ours) == 0 {
			continue
		}
		key := m[1] + " in " + ours[0]
		if groups[key] == nil {
			groups[key] = &group{stack: strings.Join(ours[:min(len(ours), 6)], " <- ")}
		}
		groups[key].n++
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return groups[b].n - groups[a].n })
	var b strings.Builder
	for i, k := range keys {
		if i == top {
			fmt.Fprintf(&b, "  ... %d more groups\n", len(keys)-top)
			break
		}
		fmt.Fprintf(&b, "  %d× %s: %s\n", groups[k].n, k, groups[k].stack)
	}
	if b.Len() == 0 {
		return "  none"
	}
	return strings.TrimRight(b.String(), "\n")
}

func TestLongWaits_GroupsGoroutinesThatWaitedMinutes(t *testing.T) {
	dump := []byte(`goroutine 1 [chan receive, 2 minutes]:
stockd.dev/stockd/engine.(*Engine).wait(0xc000)
	/src/engine/x.go:10 +0x1
stockd.dev/stockd/engine.(*Engine).Deduct(0xc000)
	/src/engine/y.go:20 +0x1

goroutine 2 [chan receive, 3 minutes]:
runtime.gopark(0x1)
	/go/src/runtime/proc.go:1 +0x1
stockd.dev/stockd/engine.(*Engine).wait(0xc001)
	/src/engine/x.go:10 +0x1

goroutine 3 [sync.Mutex.Lock, 1 minutes, locked to thread]:
stockd.dev/stockd/raftnode.(*Node).Propose(0xc002)
	/src/raftnode/n.go:5 +0x1

goroutine 4 [chan receive]:
stockd.dev/stockd/engine.(*Engine).wait(0xc003)
	/src/engine/x.go:10 +0x1

goroutine 5 [select, 5 minutes]:
net/http.(*conn).serve(0xc004)
	/go/src/net/http/server.go:1 +0x1
`)
	got := longWaits(dump, 12)
	want := "  2× chan receive in stockd.dev/stockd/engine.(*Engine).wait: stockd.dev/stockd/engine.(*Engine).wait <- stockd.dev/stockd/engine.(*Engine).Deduct\n" +
		"  1× sync.Mutex.Lock in stockd.dev/stockd/raftnode.(*Node).Propose: stockd.dev/stockd/raftnode.(*Node).Propose"
	if got != want {
		t.Fatalf("longWaits:\n%s\nwant:\n%s", got, want)
	}
	if got := longWaits(goroutineDump(), 12); got != "  none" {
		t.Fatalf("a fresh test binary has no goroutine of this module waiting minutes, got:\n%s", got)
	}
}
