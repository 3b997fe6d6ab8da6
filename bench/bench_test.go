package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// brokenStrategy sells without looking at the stock: every deduct wins.
type brokenStrategy struct {
	inprocStrategy
	total int64
}

func (b *brokenStrategy) Setup(_ context.Context, s *Scenario) error {
	b.total = s.TotalUnits()
	b.sold.Store(0)
	return nil
}

func (b *brokenStrategy) Deduct(_ context.Context, _ int, r *Request) Outcome {
	b.sold.Add(r.Qty)
	return Outcome{Win: true, OrderID: r.RequestID}
}

func (b *brokenStrategy) Final(context.Context) (Final, error) {
	return Final{Sold: b.sold.Load(), Remaining: b.total - b.sold.Load(), Valid: true}, nil
}

func testOptions() Options {
	return Options{Units: 50, Requests: 2000, Conns: 8, Duration: 10 * time.Second, SKUs: 10, ZipfS: 1.1, RetryShare: 0.3, HoldTTL: time.Second}
}

func TestOversold_CatchesABrokenStrategy(t *testing.T) {
	o := testOptions()
	sc, err := NewScenario("flash", &o, "t")
	if err != nil {
		t.Fatal(err)
	}
	broken := &brokenStrategy{inprocStrategy: inprocStrategy{name: "broken"}}
	run, err := runOne(context.Background(), broken, sc, &o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if run.Oversold != int64(o.Requests)-o.Units {
		t.Fatalf("oversold %d, want %d (every request won, %d units)", run.Oversold, int64(o.Requests)-o.Units, o.Units)
	}
	report := &Report{Runs: []*Run{run}}
	if bad := report.Failed(); len(bad) != 1 || !strings.Contains(bad[0], "oversold 1950") {
		t.Fatalf("report did not fail the broken strategy: %v", bad)
	}
}

func TestOversold_Formula(t *testing.T) {
	f := func(kept, total, sold, want int64) {
		t.Helper()
		if got := Oversold(kept, total, sold); got != want {
			t.Fatalf("Oversold(%d, %d, %d) = %d, want %d", kept, total, sold, got, want)
		}
	}
	f(10, 10, 10, 0)
	f(9, 10, 9, 0)
	f(11, 10, 10, 1) // acknowledged more than the stock
	f(10, 10, 12, 2) // the store sold more than it had
}

// Every honest strategy that runs in this process ends each scenario with
// oversold 0 and a count that adds up.
func TestRun_InprocStrategiesNeverOversell(t *testing.T) {
	o := testOptions()
	for _, name := range []string{"flash", "plentiful", "hot-cold", "retry-storm"} {
		sc, err := NewScenario(name, &o, "t")
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []Strategy{newInprocMutex(), newInprocAtomic(), newInprocBuckets()} {
			run, err := runOne(context.Background(), st, sc, &o, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantWins := min(int64(o.Requests), sc.TotalUnits())
			if name == "retry-storm" || name == "hot-cold" {
				wantWins = -1 // depends on the request mix
			}
			if run.Oversold != 0 || !run.Final.Valid || run.Sent != o.Requests || (wantWins >= 0 && int64(run.Wins) != wantWins) {
				t.Fatalf("%s/%s: %+v", name, st.Name(), run)
			}
			if int64(run.Wins) != run.Final.Sold {
				t.Fatalf("%s/%s: %d wins, store sold %d", name, st.Name(), run.Wins, run.Final.Sold)
			}
		}
	}
}

func TestScenario_RetryStormResendsEarlierRequests(t *testing.T) {
	o := testOptions()
	sc, err := NewScenario("retry-storm", &o, "t")
	if err != nil {
		t.Fatal(err)
	}
	var resent atomic.Int64
	seen := map[string]bool{}
	for i := 0; i < sc.Requests; i++ {
		r := sc.Request(i)
		if r.Resend {
			resent.Add(1)
			if !seen[r.RequestID] {
				t.Fatalf("request %d re-sends %s, which was never sent", i, r.RequestID)
			}
		}
		seen[r.RequestID] = true
	}
	share := float64(resent.Load()) / float64(sc.Requests)
	if share < 0.25 || share > 0.35 {
		t.Fatalf("re-sent share %.2f, want about %.2f", share, o.RetryShare)
	}
}

func TestScenario_HotColdFavoursTheFirstSKUs(t *testing.T) {
	o := testOptions()
	sc, err := NewScenario("hot-cold", &o, "t")
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(sc.SKUs))
	for i := 0; i < sc.Requests; i++ {
		counts[sc.Request(i).SKU]++
	}
	if counts[0] <= counts[1] || counts[1] <= counts[len(counts)-1] {
		t.Fatalf("Zipf counts not decreasing: %v", counts)
	}
}

func TestTailChecks_CountFlipsLateWinsAndTheTail(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	req := func(id string, sku int) *Request { return &Request{RequestID: id, Buyer: int(id[0]), SKU: sku} }
	w1 := &workerStats{firstSoldOut: map[int]time.Time{0: at(100)}}
	w2 := &workerStats{firstSoldOut: map[int]time.Time{0: at(120), 1: at(300)}}
	w1.note(req("a", 0), at(90), at(130), answerWin)  // won before the sold_out ended: the tail is 30 ms
	w2.note(req("a", 0), at(95), at(125), answerLoss) // ... and lost on another worker: a flip
	w1.note(req("b", 0), at(101), at(105), answerWin) // first sent after the sold_out: a late win
	w1.note(req("c", 0), at(50), at(60), answerWin)   // won early ...
	w2.note(req("c", 0), at(150), at(155), answerWin) // ... and re-sent after: its first win again, not late
	w1.note(req("d", 1), at(200), at(210), answerWin) // SKU 1 sold out later: no tail
	var run Run
	tailChecks(&run, []*workerStats{w1, w2})
	if run.Flips != 1 || run.LateWins != 1 || run.TailMs != 30 {
		t.Fatalf("flips %d, late wins %d, tail %v ms; want 1, 1, 30", run.Flips, run.LateWins, run.TailMs)
	}
}

func TestWriteHTML_InProcessCountersOnTheirOwnPanels(t *testing.T) {
	served := &Run{Scenario: "plentiful", Strategy: "stockd-commit", Timeline: []Slot{{AtSec: 0, Seconds: 1, Requests: 1000}, {AtSec: 1, Seconds: 1, Requests: 1200}}}
	inproc := &Run{Scenario: "plentiful", Strategy: "inproc-atomic", Timeline: []Slot{{AtSec: 0, Seconds: 1, Requests: 5_000_000}}}
	r := &Report{Runs: []*Run{served, inproc}}
	path := filepath.Join(t.TempDir(), "report.html")
	if err := r.WriteHTML(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"throughput, servers", "throughput, in-process counters"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("the report has no panel %q", want)
		}
	}
	charts := timelineCharts("servers", []*Run{served})
	if top := charts[0].MaxY; top >= float64(inproc.Timeline[0].Requests) {
		t.Fatalf("the servers' throughput panel tops at %v: an in-process line is on it", top)
	}
}

// TestTimeline_JoinsSlotsIntoAFewPoints: a row's slots become at most
// timelinePoints of the time it ran, the requests all counted, the last
// one as long as the row lasted; a short row keeps its fine slots.
func TestTimeline_JoinsSlotsIntoAFewPoints(t *testing.T) {
	slots := make([]slotStats, 1002)
	for i := range slots[:1000] {
		slots[i] = slotStats{n: 10, sumNanos: 10 * int64(time.Millisecond), maxNanos: int64(i)}
	}
	for _, c := range []struct {
		elapsed  time.Duration
		points   int
		requests int
		last     float64
	}{
		{300 * time.Millisecond, 30, 300, 0.01},
		{305 * time.Millisecond, 31, 310, 0.005},
		{10 * time.Second, 100, 10_000, 0.1},
		{9_995 * time.Millisecond, 100, 10_000, 0.095},
	} {
		tl := timeline(slots, 10*time.Millisecond, c.elapsed)
		n := 0
		for _, s := range tl {
			n += s.Requests
			if s.Requests > 0 && s.MeanLatency != 1 {
				t.Fatalf("%s: mean latency %v ms, want 1", c.elapsed, s.MeanLatency)
			}
		}
		last := tl[len(tl)-1]
		if len(tl) != c.points || n != c.requests || math.Abs(last.Seconds-c.last) > 1e-9 {
			t.Errorf("%s: %d points, %d requests, the last %v s long; want %d, %d, %v", c.elapsed, len(tl), n, last.Seconds, c.points, c.requests, c.last)
		}
	}
}

// TestScenario_RequestIDs: a request's ids are the buyer's, built without
// fmt; a re-sent request carries its buyer's request id.
func TestScenario_RequestIDs(t *testing.T) {
	o := testOptions()
	sc, err := NewScenario("retry-storm", &o, "run7")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < sc.Requests; i++ {
		r := sc.Request(i)
		if want := fmt.Sprintf("u%d", r.Buyer); r.User != want {
			t.Fatalf("request %d: user %q, want %q", i, r.User, want)
		}
		if want := fmt.Sprintf("run7-retry-storm-%d", r.Buyer); r.RequestID != want {
			t.Fatalf("request %d: request id %q, want %q", i, r.RequestID, want)
		}
	}
}

// TestAppendJSONString: plain ids are copied, anything else is quoted as
// JSON reads it.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "u12", "a-b_c.9", `quo"te`, `back\slash`, "new\nline", "é", "\x7f"} {
		got := appendJSONString([]byte("x"), s)
		var back string
		if err := json.Unmarshal(got[1:], &back); err != nil || back != s {
			t.Fatalf("%q: appended %s, read back %q (%v)", s, got, back, err)
		}
	}
}

// TestParseFlags_ReplicatedRedis: -redis-wait and -redis-pids reach the
// options; a PID that is not one is refused, naming it.
func TestParseFlags_ReplicatedRedis(t *testing.T) {
	o, err := parseFlags([]string{"-redis", "127.0.0.1:6379", "-redis-wait", "1", "-redis-pids", "10,11,12"}, io.Discard)
	if err != nil || o.RedisWait != 1 || !slices.Equal(o.RedisPIDs, []int{10, 11, 12}) {
		t.Fatalf("options %+v, err %v", o, err)
	}
	if _, err := parseFlags([]string{"-redis-pids", "10,x"}, io.Discard); err == nil || !strings.Contains(err.Error(), `"x" is not a process id`) {
		t.Fatalf("-redis-pids 10,x: err %v", err)
	}
}

// TestParseFlags_LaunchSuffixes: tls puts clients and nodes on TLS,
// peertls only the nodes among themselves; anything else is refused.
func TestParseFlags_LaunchSuffixes(t *testing.T) {
	o, err := parseFlags([]string{"-launch", "1,3tls,3peertls,3nofeedpeertls"}, io.Discard)
	want := []Launch{{Nodes: 1}, {Nodes: 3, TLS: true}, {Nodes: 3, PeerTLS: true}, {Nodes: 3, NoFeed: true, PeerTLS: true}}
	if err != nil || !slices.Equal(o.Launches, want) {
		t.Fatalf("launches %+v, want %+v (err %v)", o.Launches, want, err)
	}
	for _, bad := range []string{"3peer", "3tlspeertls", "2peertls"} {
		if _, err := parseFlags([]string{"-launch", bad}, io.Discard); err == nil {
			t.Fatalf("-launch %s accepted", bad)
		}
	}
	peer := &launchTLS{dir: "/c"}
	if args := strings.Join(peer.nodeArgs("n2"), " "); args != "-node-cert /c/n2.pem -node-key /c/n2-key.pem -node-ca /c/ca.pem" {
		t.Fatalf("peer TLS node args %q", args)
	}
	if args := (&launchTLS{dir: "/c", https: true}).nodeArgs("n2"); !slices.Contains(args, "-http-cert") {
		t.Fatalf("TLS node args %q lack -http-cert", args)
	}
}
