package scenario

import (
	"cmp"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"

	"github.com/anishathalye/porcupine"
	"github.com/valyala/fasthttp"
)

// The nemesis: seeded random fault schedules against an in-process
// cluster of real nodes, a sale running through them, and afterwards the
// ledger's invariants plus a linearizability check of what buyers saw.
//
//	go test -run 'TestNemesis$' ./scenario                      2 schedules, 3 nodes (the default suite)
//	STOCKD_NEMESIS=20,5 go test -run 'TestNemesis$' ./scenario  20 over three nodes, 5 over five
//	go test -run 'TestNemesis$' ./scenario -seed 1234           replay one schedule (3 nodes; -nemesis.nodes 5)
//	go test -run 'TestNemesis$' ./scenario -nemesis.faults crash,remove-join   only these faults
//
// The test's own flags (-seed, -nemesis.*) follow the package: go test
// passes the flags after it to the test binary.
var (
	nemesisSeed   = flag.Uint64("seed", 0, "TestNemesis: replay the schedule of this seed only")
	nemesisNodes  = flag.Int("nemesis.nodes", 3, "TestNemesis: cluster size for -seed")
	nemesisFaults = flag.String("nemesis.faults", "", "TestNemesis: draw only these fault kinds (comma-separated), e.g. remove-join,crash")
)

// nemesisTotals add up what every schedule of this run did.
var nemesisTotals struct {
	schedules, faults, deducts, violations, restores atomic.Int64
}

func TestNemesis(t *testing.T) {
	type run struct {
		nodes int
		seed  uint64
	}
	var runs []run
	if *nemesisSeed != 0 {
		runs = append(runs, run{*nemesisNodes, *nemesisSeed})
	} else {
		three, five := 2, 0
		if v := os.Getenv("STOCKD_NEMESIS"); v != "" {
			a, b, _ := strings.Cut(v, ",")
			var err error
			if three, err = strconv.Atoi(a); err != nil {
				t.Fatalf("STOCKD_NEMESIS=%q: want <three-node schedules>[,<five-node schedules>]", v)
			}
			if b != "" {
				if five, err = strconv.Atoi(b); err != nil {
					t.Fatalf("STOCKD_NEMESIS=%q: want <three-node schedules>[,<five-node schedules>]", v)
				}
			}
		}
		base := uint64(time.Now().UnixNano()) % 1_000_000_000
		for i := range three {
			runs = append(runs, run{3, base + uint64(i)})
		}
		for i := range five {
			runs = append(runs, run{5, base + uint64(three+i)})
		}
	}
	// A harness that leaks grows with every schedule of a long soak.
	goroutinesBefore := runtime.NumGoroutine()
	defer func() {
		t.Logf("goroutines: %d before the first schedule, %d after the last", goroutinesBefore, runtime.NumGoroutine())
	}()
	for _, r := range runs {
		t.Run(fmt.Sprintf("nodes=%d/seed=%d", r.nodes, r.seed), func(t *testing.T) {
			nemesisTotals.schedules.Add(1)
			defer func() {
				if t.Failed() {
					nemesisTotals.violations.Add(1)
					t.Logf("replay: %s", nemesisReplay(r.seed, r.nodes))
				}
			}()
			runNemesis(t, r.nodes, r.seed)
		})
	}
	t.Logf("nemesis summary: %d schedules, %d faults injected, %d deducts, %d snapshots installed on running followers, %d schedules with violations",
		nemesisTotals.schedules.Load(), nemesisTotals.faults.Load(), nemesisTotals.deducts.Load(),
		nemesisTotals.restores.Load(), nemesisTotals.violations.Load())
}

// nemesisReplay is the command that replays one schedule, as a person
// pastes it: the test's flags after the package, which go test hands to
// the test binary (before it, go test refuses them).
func nemesisReplay(seed uint64, nodes int) string {
	cmd := fmt.Sprintf("go test -count=1 -v -run 'TestNemesis$' ./scenario -seed %d -nemesis.nodes %d", seed, nodes)
	if *nemesisFaults != "" {
		cmd += " -nemesis.faults " + *nemesisFaults
	}
	return cmd
}

// nemesisSale sizes one schedule's sale: demand above stock on the tv
// SKUs tv0..tv3 (a per-user limit, re-sent request ids), holds on "box"
// (confirmed, cancelled or left to expire). tv is split into SKUs so that
// the linearizability check, which is exponential in the operations in
// flight at once, runs SKU by SKU. A buyer b buys tv<b%tvSKUs>.
const (
	tvSKUs                                = 4
	tvUnits, tvBuyers, tvUsers, tvPerUser = 40, 80, 30, 2 // per tv SKU
	tvWorkers                             = 5             // per tv SKU
	boxUnits, boxBuyers                   = 60, 100
	boxHoldTTL                            = 800 * time.Millisecond
	nemesisCallTimeout                    = 3 * time.Second
	nemesisBuyersGrace                    = time.Minute
	skuReadStaleness                      = time.Second
)

func runNemesis(t *testing.T, size int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	began := time.Now()
	phase := func(what string) { t.Logf("phase %s at %s", what, time.Since(began).Round(time.Millisecond)) }
	// Each node's raft log can be made to fail its appends (a full disk).
	// Odd seeds serve plain deducts from the event loop
	// (-http-event-loop), so that it meets every fault too.
	loop := seed%2 == 1
	c, disks := startDiskCluster(t, size, func(cfg *node.Config) {
		// Snapshots keep little log behind them, so a node that was down
		// or cut off through one catches up by installing the leader's
		// snapshot (a restore mid-sale), not by replaying entries. (An
		// append then carries 8 entries: fewer than a follower keeps, see
		// raftnode's raftConfig.)
		cfg.Raft.SnapshotThreshold, cfg.Raft.TrailingLogs, cfg.Raft.SnapshotInterval = 64, 16, 300*time.Millisecond
		cfg.DeductLoop = loop
	})
	phase(fmt.Sprintf("cluster up (event loop: %v)", loop))
	for _, sale := range []string{
		fmt.Sprintf(`PUT /v1/skus/box {"total":%d,"hold_ttl":"%s"}`, boxUnits, boxHoldTTL),
		fmt.Sprintf(`PUT /v1/skus/tv0 {"total":%d,"per_user":%d}`, tvUnits, tvPerUser),
		fmt.Sprintf(`PUT /v1/skus/tv1 {"total":%d,"per_user":%d}`, tvUnits, tvPerUser),
		fmt.Sprintf(`PUT /v1/skus/tv2 {"total":%d,"per_user":%d}`, tvUnits, tvPerUser),
		fmt.Sprintf(`PUT /v1/skus/tv3 {"total":%d,"per_user":%d}`, tvUnits, tvPerUser),
	} {
		method, rest, _ := strings.Cut(sale, " ")
		path, body, _ := strings.Cut(rest, " ")
		if code, out := nodetest.Call(t, c.Client(c.IDs[0]), method, path, body); code != 201 {
			t.Fatalf("%s: %d %v", sale, code, out)
		}
	}
	nodetest.WaitSaleEverywhere(t, c, "box")
	for k := range tvSKUs {
		nodetest.WaitSaleEverywhere(t, c, tvSKU(k))
	}

	// Buyers arrive at an even pace over the schedule's length, so that
	// every fault strikes mid-sale.
	schedule := nemesisSchedule(t, rng)
	var span time.Duration
	for _, f := range schedule {
		span += f.dur
	}
	h := &nemesisHistory{start: time.Now()}
	h.giveUp = h.start.Add(span + nemesisBuyersGrace)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); h.buyTV(c, seed, span) }()
	go func() { defer wg.Done(); h.buyBoxes(c, seed, span) }()
	go func() { defer wg.Done(); h.readLeader(c, stop) }()

	crashed := map[string]bool{}
	for _, f := range schedule {
		nemesisTotals.faults.Add(1)
		t.Logf("%6.2fs %s", time.Since(h.start).Seconds(), f.run(t, c, rng, crashed, disks))
		restartBroken(t, c, h.start)
	}
	phase("schedule done")
	c.Net.HealAll()
	for id := range crashed {
		c.StartWith(id, nil, nil)
	}
	restartBroken(t, c, h.start)
	close(stop)
	wg.Wait()
	// A run that fails before its ledgers are checked was stuck, not
	// wrong: say on what, since a replay may not repeat it.
	checked := false
	defer func() {
		if t.Failed() && !checked {
			h.stallReport(t, c, seed)
		}
	}()
	if n := h.late.Load(); n > 0 {
		t.Errorf("%d buyers still without a final answer %s after the schedule's end", n, nemesisBuyersGrace)
		h.stallReport(t, c, seed)
		checked = true // reported
	}
	nemesisWaitReady(t, c)
	nemesisTotals.deducts.Add(h.deducts.Load())
	for _, id := range c.IDs {
		nemesisTotals.restores.Add(int64(c.Node(id).Ledger().Restores()))
	}

	phase("buyers done")
	// The sale runs to its end once healed: nothing may stay stranded.
	for k := range tvSKUs {
		sellOut(t, c, tvSKU(k), tvUnits, 1_000_000*(k+1))
	}
	phase("sold out")
	leader := func() *fasthttp.HostClient {
		var cl *fasthttp.HostClient
		nodetest.WaitFor(t, 20*time.Second, "a leader", func() bool {
			if id := c.Leader(); id != "" {
				cl = c.Client(id)
			}
			return cl != nil
		})
		return cl
	}
	nodetest.WaitFor(t, 20*time.Second, "every hold on box confirmed, cancelled or expired, no lease left", func() bool {
		cl := leader()
		for k := range tvSKUs {
			if _, tv := nodetest.CallQuiet(cl, "GET", "/v1/skus/"+tvSKU(k)+"/audit", ""); tv == nil || !nothingLeased(tv) {
				return false
			}
		}
		_, box := nodetest.CallQuiet(cl, "GET", "/v1/skus/box/audit", "")
		return box != nil && box["held"] == 0.0 && nothingLeased(box)
	})
	phase("holds ended")
	checked = true // what fails from here is an answer, not a stall
	acked := h.tvAcked(t)
	for k := range tvSKUs {
		a := checkClusterLedgers(t, c, tvSKU(k), acked[k])
		if a["available"] != 0.0 || a["sold"] != float64(tvUnits) || a["held"] != 0.0 {
			t.Fatalf("%s after the sale: %v, want everything sold", tvSKU(k), a)
		}
	}
	checkClusterLedgers(t, c, "box", nil)
	h.checkBoxOrders(t, c)
	phase("ledgers checked")
	results := map[string]int{}
	for _, op := range h.tvOps() {
		in, out := op.Input.(tvIn), op.Output.(tvOut)
		if in.read {
			results["read"]++
		} else {
			results[out.result]++
		}
	}
	t.Logf("tv operations: %v; answers taken as unknown: %v", results, h.unknownCodes)
	// The checker's work grows exponentially with the calls in flight at
	// once; the workers bound them.
	overlap, longest := maxOverlap(h.tvOps())
	t.Logf("tv: at most %d calls in flight at once, the longest %s", overlap, longest.Round(time.Millisecond))
	checkLinearizable(t, tvModel(tvUnits, tvUsers, tvBuyers, tvPerUser), h.tvOps(), "tv", h.explainTV)
	checkLinearizable(t, holdModel(), h.boxOps(), "box", func(part []porcupine.Operation) string {
		return h.boxStory(c, part[0].Input.(holdIn).order)
	})
	t.Logf("clean: %d deducts, %d tv and %d box operations linearizable", h.deducts.Load(), len(h.tv), len(h.box))
}

// restartBroken restarts the nodes that stopped trusting their raft log
// (node.Broken: an append failed right after a truncation), as their
// supervisor would when stockd serve exits.
func restartBroken(t *testing.T, c *nodetest.Cluster, start time.Time) {
	for _, id := range c.IDs {
		n := c.Node(id)
		if n == nil {
			continue
		}
		select {
		case <-n.Broken():
			t.Logf("%6.2fs %s stopped with a broken raft log; restarting it", time.Since(start).Seconds(), id)
			c.Crash(id)
			c.StartWith(id, nil, nil)
		default:
		}
	}
}

// nemesisWaitReady is waitReady that says, when it gives up, why each
// node was not ready.
func nemesisWaitReady(t *testing.T, c *nodetest.Cluster) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		restartBroken(t, c, deadline.Add(-30*time.Second))
		var why []string
		for _, id := range c.IDs {
			if cl := c.Client(id); cl != nil {
				if code, out := nodetest.CallQuiet(cl, "GET", "/readyz", ""); code != 200 {
					_, st := nodetest.CallQuiet(cl, "GET", "/v1/cluster", "")
					why = append(why, fmt.Sprintf("%s: %d %v; cluster %v", id, code, out, st))
				}
			}
		}
		if len(why) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes not ready 30s after the faults ended:\n%s", strings.Join(why, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nothingLeased(audit map[string]any) bool {
	leased, _ := audit["leased"].(map[string]any)
	for _, v := range leased {
		if v != 0.0 {
			return false
		}
	}
	return true
}

// nemesisFault is one step of a schedule.
type nemesisFault struct {
	kind string
	dur  time.Duration
}

var nemesisFaultKinds = []string{
	"isolate", "isolate-leader", "partition-minority", "flap", "degrade",
	"crash", "crash-leader", "stall", "transfer-leadership", "snapshot", "disk-full",
	"remove-join",
}

func nemesisSchedule(t *testing.T, rng *rand.Rand) []nemesisFault {
	kinds := nemesisFaultKinds
	if *nemesisFaults != "" {
		kinds = strings.Split(*nemesisFaults, ",")
		for _, k := range kinds {
			if !slices.Contains(nemesisFaultKinds, k) {
				t.Fatalf("-nemesis.faults: no fault %q; the faults are %s", k, strings.Join(nemesisFaultKinds, ","))
			}
		}
	}
	steps := 3 + rng.IntN(3)
	fs := make([]nemesisFault, steps)
	for i := range fs {
		fs[i] = nemesisFault{kind: kinds[rng.IntN(len(kinds))],
			dur: time.Duration(300+rng.IntN(1200)) * time.Millisecond}
	}
	return fs
}

// run injects the fault for its duration (the fault's length, not a
// wait for a condition) and ends it, except a crash whose node restarts
// at the end of the schedule if the draw says so. It says what it did.
func (f nemesisFault) run(t *testing.T, c *nodetest.Cluster, rng *rand.Rand, crashed map[string]bool, disks map[string]*diskFull) string {
	var up []string
	for _, id := range c.IDs {
		if c.Node(id) != nil {
			up = append(up, id)
		}
	}
	pick := func() string { return up[rng.IntN(len(up))] }
	target := pick()
	if l := c.Leader(); l != "" && strings.HasSuffix(f.kind, "-leader") {
		target = l
	}
	switch f.kind {
	case "isolate", "isolate-leader":
		c.Net.Isolate(target)
		time.Sleep(f.dur)
		c.Net.Heal(target)
	case "partition-minority":
		ids := append([]string(nil), c.IDs...)
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		minority := ids[:(len(ids)-1)/2]
		c.Net.Partition(minority, ids[len(minority):])
		time.Sleep(f.dur)
		c.Net.HealAll()
		return fmt.Sprintf("partition %v from the rest for %s", minority, f.dur)
	case "flap":
		for range 4 {
			c.Net.Isolate(target)
			time.Sleep(f.dur / 8)
			c.Net.Heal(target)
			time.Sleep(f.dur / 8)
		}
	case "degrade":
		delay, loss := time.Duration(1+rng.IntN(15))*time.Millisecond, rng.Float64()*0.05
		c.Net.Degrade(delay, loss)
		time.Sleep(f.dur)
		c.Net.Degrade(0, 0)
		return fmt.Sprintf("delay %s+jitter, drop %.1f%% of writes for %s", delay, loss*100, f.dur)
	case "crash", "crash-leader":
		if len(up)-1 < len(c.IDs)/2+1 {
			return f.kind + " skipped: a quorum must stay up"
		}
		c.Crash(target)
		time.Sleep(f.dur)
		if rng.IntN(4) == 0 {
			crashed[target] = true
			return fmt.Sprintf("crash %s (restarts when the schedule ends)", target)
		}
		c.StartWith(target, nil, nil)
	case "stall":
		c.Net.Stall(target)
		time.Sleep(f.dur)
		c.Net.Resume(target)
	case "transfer-leadership":
		if l := c.Leader(); l != "" {
			if err := c.Node(l).Raft().TransferLeadership(); err != nil {
				return fmt.Sprintf("transfer leadership from %s: %v", l, err)
			}
			return "transfer leadership from " + l
		}
		return "transfer leadership: no leader"
	case "disk-full":
		// Both of the node's files stop taking writes: its raft log and
		// its ledger.
		ledger := c.Node(target).Ledger()
		ledger.SetPersistFault(disks[target].fault)
		disks[target].on.Store(true)
		time.Sleep(f.dur)
		disks[target].on.Store(false)
		ledger.SetPersistFault(nil)
	case "remove-join":
		return removeAndJoin(c, rng, up, f.dur)
	case "snapshot":
		if err := c.Node(target).Raft().Snapshot(); err != nil {
			return fmt.Sprintf("snapshot on %s: %v", target, err)
		}
	}
	return fmt.Sprintf("%s %s for %s", f.kind, target, f.dur)
}

// removeAndJoin takes a node out of the cluster (DELETE
// /v1/cluster/nodes/{id} through another node), the leader as likely as
// any, either still running (a node decommissioned) or crashed first (a
// dead machine written off), and brings a replacement in under the same
// id on an empty data dir with -join, as an operator replacing a machine
// would. Every node must be up when it starts, so the cluster keeps a
// quorum without the removed one.
func removeAndJoin(c *nodetest.Cluster, rng *rand.Rand, up []string, dur time.Duration) string {
	if len(up) < len(c.IDs) {
		return "remove-join skipped: every node must be up"
	}
	target := up[rng.IntN(len(up))]
	var via string
	for via == "" || via == target {
		via = up[rng.IntN(len(up))]
	}
	crashFirst := rng.IntN(2) == 0
	if crashFirst {
		c.Crash(target)
	}
	// A leader election from the step before may still be running.
	deadline := time.Now().Add(10 * time.Second)
	code, out := 0, map[string]any(nil)
	for time.Now().Before(deadline) {
		if code, out = nodetest.CallWithin(c.Client(via), 3*time.Second, "DELETE", "/v1/cluster/nodes/"+target, ""); code == 200 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != 200 {
		if crashFirst {
			c.StartWith(target, nil, nil)
		}
		return fmt.Sprintf("remove %s through %s: %d %v; it stays a member", target, via, code, out)
	}
	time.Sleep(dur / 2) // the cluster runs without it
	if !crashFirst {
		c.Crash(target)
	}
	c.Dirs[target] = c.TempDir()
	joinVia := "http://" + c.Node(via).HTTPAddr()
	c.StartWith(target, nil, func(cfg *node.Config) { cfg.Peers, cfg.Join = nil, joinVia })
	time.Sleep(dur / 2)
	how := "removed while running"
	if crashFirst {
		how = "crashed, then removed"
	}
	return fmt.Sprintf("remove-join %s (%s, %v reclaimed) through %s, rejoined on an empty data dir, for %s", target, how, out["reclaimed_units"], via, dur)
}

// nemesisOp is one call a buyer or reader made, as porcupine sees it.
type nemesisOp struct {
	client    int
	call, ret int64 // since the history's start; ret is MaxInt64 when the outcome is unknown
	in        any
	out       any
}

type nemesisHistory struct {
	start   time.Time
	deducts atomic.Int64
	// giveUp is when buyers stop retrying (nemesisBuyersGrace after the
	// schedule's end), and late counts the buyers it stopped: a node that
	// stops catching up fails the run then, not after every buyer's 40
	// attempts of up to nemesisCallTimeout each.
	giveUp time.Time
	late   atomic.Int64

	mu       sync.Mutex
	tv       []nemesisOp
	box      []nemesisOp
	tvWins   map[int]map[string]bool // buyer -> orders acknowledged to it (tv<buyer%tvSKUs>)
	boxFate  map[string]string       // order -> sold, released, or "" when unknown
	boxBuyer map[string]int          // order -> the box buyer it was acknowledged to
	// boxCalls is every call a box buyer made (deducts, confirms,
	// cancels) with the node that answered and its answer: a failed
	// check prints its order's story from them.
	boxCalls     []boxCall
	unknownCodes map[string]int
	clients      map[string]*fasthttp.HostClient // by HTTP address
	// tvCalls is every tv deduct call with the node that answered and
	// its answer, the 429s and 503s the history leaves out included: a
	// failed check prints its SKU's.
	tvCalls []tvCall
}

// tvCall is one deduct call on tv as sent and answered.
type tvCall struct {
	sku, buyer, client int
	node               string
	call, ret          int64
	code               int
	answer             string // error and detail, or the order id
}

func (h *nemesisHistory) now() int64 { return time.Since(h.start).Nanoseconds() }

// client is a connection pool to node id while it runs, nil while it is
// down. Pools are the history's own, large enough for every buyer of a
// schedule, so that no call is turned away by the client itself.
func (h *nemesisHistory) Client(c *nodetest.Cluster, id string) *fasthttp.HostClient {
	n := c.Node(id)
	if n == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.clients == nil {
		h.clients = map[string]*fasthttp.HostClient{}
	}
	cl := h.clients[n.HTTPAddr()]
	if cl == nil {
		cl = &fasthttp.HostClient{Addr: n.HTTPAddr(), MaxConns: 512, MaxConnWaitTimeout: nemesisCallTimeout,
			ReadTimeout: nemesisCallTimeout, WriteTimeout: nemesisCallTimeout}
		h.clients[n.HTTPAddr()] = cl
	}
	return cl
}

// nemesisCall is one HTTP call with the schedule's short timeout; a node
// that is down (nil client) answers code 0 like one that does not answer.
func nemesisCall(cl *fasthttp.HostClient, method, path, body string) (int, map[string]any) {
	if cl == nil {
		return 0, nil
	}
	return nodetest.CallWithin(cl, nemesisCallTimeout, method, path, body)
}

// tvIn and tvOut are a deduct on tv, or a read of its sold count.
type tvIn struct {
	read             bool
	sku, buyer, user int // buyer and user count within the SKU
}

type tvOut struct {
	result string // won, sold_out, user_limit, unknown; read: ""
	sold   int
}

// buyTV sends tv's buyers at an even pace over span from tvWorkers
// workers per SKU, each buyer retrying on one node after another until it
// has a final answer; one buyer in 20 sends its request to two nodes at
// once. The workers bound the calls in flight, and so the checker's work.
func (h *nemesisHistory) buyTV(c *nodetest.Cluster, seed uint64, span time.Duration) {
	const workers = tvWorkers * tvSKUs
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < tvBuyers*tvSKUs; b += workers {
				time.Sleep(time.Until(h.start.Add(span * time.Duration(b) / (tvBuyers * tvSKUs))))
				var twice sync.WaitGroup
				for k := range 1 + btoi(b%20 == 7) {
					twice.Add(1)
					go func() { defer twice.Done(); h.deductTV(c, seed, w+k*workers, b, b+k) }()
				}
				twice.Wait()
			}
		}()
	}
	wg.Wait()
}

// pastGiveUp reports whether buyers are to stop retrying, and counts the
// buyer that asks then.
func (h *nemesisHistory) pastGiveUp() bool {
	if time.Now().Before(h.giveUp) {
		return false
	}
	h.late.Add(1)
	return true
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (h *nemesisHistory) logCall(tc tvCall, out map[string]any) {
	errCode, _ := out["error"].(string)
	detail, _ := out["detail"].(string)
	order, _ := out["order_id"].(string)
	tc.answer = strings.TrimSpace(errCode + " " + detail + " " + order)
	h.mu.Lock()
	h.tvCalls = append(h.tvCalls, tc)
	h.mu.Unlock()
}

// explainTV lists every call on the SKU of a tv history that failed the
// check, in call order: which node answered what, including the answers
// the history leaves out.
func (h *nemesisHistory) explainTV(part []porcupine.Operation) string {
	sku := -1
	for _, op := range part {
		if in := op.Input.(tvIn); !in.read {
			sku = in.sku
			break
		}
	}
	h.mu.Lock()
	calls := slices.Clone(h.tvCalls)
	h.mu.Unlock()
	slices.SortFunc(calls, func(a, b tvCall) int { return cmp.Compare(a.call, b.call) })
	var b strings.Builder
	fmt.Fprintf(&b, "every call on tv%d, with the node and its answer:", sku)
	for _, tc := range calls {
		if tc.sku == sku {
			fmt.Fprintf(&b, "\n  %.3fs..%.3fs client %d buyer %d %s: %d %s", float64(tc.call)/1e9, float64(tc.ret)/1e9, tc.client, tc.buyer, tc.node, tc.code, tc.answer)
		}
	}
	return b.String()
}

func (h *nemesisHistory) deductTV(c *nodetest.Cluster, seed uint64, client, buyer, firstNode int) {
	sku := buyer % tvSKUs
	user := buyer / tvSKUs % tvUsers
	body := fmt.Sprintf(`{"user":"tv-u%d","request_id":"tv-%d-%d"}`, user, seed, buyer)
	for attempt := range 40 {
		if h.pastGiveUp() {
			return
		}
		node := c.IDs[(firstNode+attempt)%len(c.IDs)]
		cl := h.Client(c, node)
		if cl == nil {
			continue
		}
		call := h.now()
		code, out := nemesisCall(cl, "POST", "/v1/skus/"+tvSKU(sku)+"/deduct", body)
		ret := h.now()
		h.deducts.Add(1)
		h.logCall(tvCall{sku: sku, buyer: buyer / tvSKUs, client: client, node: node, call: call, ret: ret, code: code}, out)
		o := tvOut{result: "unknown"}
		errCode, _ := out["error"].(string)
		switch {
		case code == 200:
			o.result = "won"
			order, _ := out["order_id"].(string)
			h.mu.Lock()
			if h.tvWins == nil {
				h.tvWins = map[int]map[string]bool{}
			}
			if h.tvWins[buyer] == nil {
				h.tvWins[buyer] = map[string]bool{}
			}
			h.tvWins[buyer][order] = true
			h.mu.Unlock()
		case code == 409 && (errCode == "sold_out" || errCode == "user_limit"):
			o.result = errCode
		case code == 429 || code == 503:
			// try_again, rate_limited, unavailable: nothing was taken by
			// this call (a 503 never follows a proposal whose fate is
			// open); not an operation.
			time.Sleep(20 * time.Millisecond)
			continue
		default:
			ret = math.MaxInt64
			h.mu.Lock()
			if h.unknownCodes == nil {
				h.unknownCodes = map[string]int{}
			}
			h.unknownCodes[fmt.Sprintf("%d %s", code, errCode)]++
			h.mu.Unlock()
		}
		h.mu.Lock()
		h.tv = append(h.tv, nemesisOp{client: client, call: call, ret: ret, in: tvIn{sku: sku, buyer: buyer / tvSKUs, user: user}, out: o})
		h.mu.Unlock()
		if o.result != "unknown" {
			return
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// readLeader reads the tv SKUs' sold counts in turn (up to a second stale,
// as the contract allows) from the node that leads, every few
// milliseconds until stop; answers marked stale are left out.
func (h *nemesisHistory) readLeader(c *nodetest.Cluster, stop <-chan struct{}) {
	var reads uint
	for {
		select {
		case <-stop:
			return
		case <-time.After(60 * time.Millisecond):
		}
		id := c.Leader()
		if id == "" {
			continue
		}
		call := h.now()
		sku := int(reads % tvSKUs)
		reads++
		code, out := nemesisCall(h.Client(c, id), "GET", "/v1/skus/"+tvSKU(sku), "")
		ret := h.now()
		if code != 200 || out["stale"] == true {
			continue
		}
		sold, _ := out["sold"].(float64)
		// The contract: a SKU read is "cacheable for a second". A leader cut
		// off from its quorum answers from its last state until its lease
		// runs out, so a read may show the state of up to a second before
		// it was made: its interval starts that much earlier.
		call = max(0, call-skuReadStaleness.Nanoseconds())
		h.mu.Lock()
		h.tv = append(h.tv, nemesisOp{client: 128, call: call, ret: ret, in: tvIn{read: true, sku: sku}, out: tvOut{sold: int(sold)}})
		h.mu.Unlock()
	}
}

// holdIn and holdOut are a confirm, cancel or expiry of one held order.
type holdIn struct {
	order string
	op    string // confirm, cancel, expire (the janitor's, placed by the test)
}

type holdOut struct {
	result string // ok, expired, invalid_state, unknown
}

// buyBoxes sends box's buyers at an even pace over span: each winner
// confirms (half), cancels (a quarter) or leaves its hold to expire, after
// a random pause around the hold time.
func (h *nemesisHistory) buyBoxes(c *nodetest.Cluster, seed uint64, span time.Duration) {
	var wg sync.WaitGroup
	for b := range boxBuyers {
		time.Sleep(time.Until(h.start.Add(span * time.Duration(b) / boxBuyers)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(b)))
			h.buyBox(c, rng, 64+b%64, b, fmt.Sprintf(`{"user":"box-u%d","request_id":"box-%d-%d"}`, b, seed, b))
		}()
	}
	wg.Wait()
}

func (h *nemesisHistory) buyBox(c *nodetest.Cluster, rng *rand.Rand, client, buyer int, body string) {
	var order string
	var called int64
	for attempt := range 40 {
		if h.pastGiveUp() {
			return
		}
		node := c.IDs[(buyer+attempt)%len(c.IDs)]
		cl := h.Client(c, node)
		if cl == nil {
			continue
		}
		if called == 0 {
			called = h.now()
		}
		code, out := h.callBox(cl, boxCall{buyer: buyer, node: node, op: "deduct"}, "POST", "/v1/skus/box/deduct", body)
		h.deducts.Add(1)
		if code == 200 {
			order, _ = out["order_id"].(string)
			break
		}
		if code == 409 {
			return
		}
		time.Sleep(30 * time.Millisecond)
	}
	if order == "" {
		return
	}
	// The janitor may expire the hold from the moment the first attempt
	// was made plus the hold time.
	h.mu.Lock()
	h.box = append(h.box, nemesisOp{client: client, call: called + boxHoldTTL.Nanoseconds(), ret: math.MaxInt64,
		in: holdIn{order: order, op: "expire"}, out: holdOut{result: "ok"}})
	if h.boxFate == nil {
		h.boxFate = map[string]string{}
	}
	h.boxFate[order] = "released" // unless confirmed below
	if h.boxBuyer == nil {
		h.boxBuyer = map[string]int{}
	}
	h.boxBuyer[order] = buyer
	h.mu.Unlock()
	var op string
	switch r := rng.IntN(4); {
	case r < 2:
		op = "confirm"
	case r == 2:
		op = "cancel"
	default:
		return
	}
	time.Sleep(time.Duration(rng.Int64N(int64(boxHoldTTL * 5 / 4))))
	for attempt := range 40 {
		node := c.IDs[(buyer+attempt+1)%len(c.IDs)]
		cl := h.Client(c, node)
		if cl == nil {
			continue
		}
		call := h.now()
		code, out := h.callBox(cl, boxCall{buyer: buyer, node: node, op: op, order: order}, "POST", "/v1/orders/"+order+"/"+op, "")
		ret := h.now()
		o := holdOut{result: "unknown"}
		errCode, _ := out["error"].(string)
		switch {
		case code == 200:
			o.result = "ok"
		case code == 409 && (errCode == "expired" || errCode == "invalid_state"):
			o.result = errCode
		case code == 503:
			// Surely not applied (no leader, or the relay never reached
			// it); not an operation.
			time.Sleep(30 * time.Millisecond)
			continue
		default:
			ret = math.MaxInt64
		}
		h.mu.Lock()
		if o.result == "unknown" {
			if h.unknownCodes == nil {
				h.unknownCodes = map[string]int{}
			}
			h.unknownCodes[fmt.Sprintf("%s %d %s", op, code, errCode)]++
		}
		h.box = append(h.box, nemesisOp{client: client, call: call, ret: ret, in: holdIn{order: order, op: op}, out: o})
		switch {
		case o.result == "unknown":
			h.boxFate[order] = ""
		case op == "confirm" && o.result == "ok":
			h.boxFate[order] = "sold"
		}
		h.mu.Unlock()
		if o.result != "unknown" {
			return
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// tvAcked checks that no buyer was told two different orders, and no
// order went to two buyers, and returns the acknowledged orders of each tv
// SKU.
func (h *nemesisHistory) tvAcked(t *testing.T) []map[string]bool {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	acked := make([]map[string]bool, tvSKUs)
	for k := range acked {
		acked[k] = map[string]bool{}
	}
	owner := map[string]int{}
	for b, orders := range h.tvWins {
		if len(orders) > 1 {
			t.Fatalf("buyer %d was told it won %d different orders: %v", b, len(orders), orders)
		}
		for o := range orders {
			if other, ok := owner[o]; ok {
				t.Fatalf("order %s acknowledged to buyers %d and %d", o, other, b)
			}
			owner[o], acked[b%tvSKUs][o] = b, true
		}
	}
	for k := range acked {
		if len(acked[k]) > tvUnits {
			t.Fatalf("oversold: %d %s orders acknowledged for %d units", len(acked[k]), tvSKU(k), tvUnits)
		}
	}
	return acked
}

func tvSKU(k int) string { return fmt.Sprintf("tv%d", k) }

// tvOps is tv's history. A call with no answer may take effect until its
// buyer's request id is known to have won: after that a take of it would
// be a repeat. So its open end closes at its buyer's first win, which
// keeps the search small.
func (h *nemesisHistory) tvOps() []porcupine.Operation {
	ops := h.operations(h.tv)
	firstWin := map[tvIn]int64{}
	for _, op := range ops {
		in, out := op.Input.(tvIn), op.Output.(tvOut)
		if out.result == "won" {
			if r, ok := firstWin[in]; !ok || op.Return < r {
				firstWin[in] = op.Return
			}
		}
	}
	for i, op := range ops {
		if r, ok := firstWin[op.Input.(tvIn)]; ok && op.Output.(tvOut).result == "unknown" && op.Call < r {
			ops[i].Return = r
		}
	}
	return ops
}

// boxOps is box's history. Any definite answer about a hold (ok, expired,
// invalid_state) means the hold has ended by then, and an ended hold
// changes no more: so a call with no answer, or the janitor's expiry, has
// its open end closed at the hold's first definite answer.
func (h *nemesisHistory) boxOps() []porcupine.Operation {
	ops := h.operations(h.box)
	ended := map[string]int64{}
	for _, op := range ops {
		in, out := op.Input.(holdIn), op.Output.(holdOut)
		if in.op != "expire" && out.result != "unknown" {
			if r, ok := ended[in.order]; !ok || op.Return < r {
				ended[in.order] = op.Return
			}
		}
	}
	for i, op := range ops {
		if r, ok := ended[op.Input.(holdIn).order]; ok && op.Return == math.MaxInt64 {
			ops[i].Return = max(r, op.Call+1)
		}
	}
	return ops
}

func (h *nemesisHistory) operations(ops []nemesisOp) []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]porcupine.Operation, len(ops))
	for i, o := range ops {
		out[i] = porcupine.Operation{ClientId: o.client, Call: o.call, Return: o.ret, Input: o.in, Output: o.out}
	}
	return out
}

// checkLinearizable fails the test unless the history fits one order of
// its operations under the model. On a failure it logs the first history
// (partition) that does not fit, in call order, and writes porcupine's
// visualization of the whole check to a file it names; explain, when
// set, adds what the harness knows beyond the history.
func checkLinearizable(t *testing.T, m porcupine.Model, ops []porcupine.Operation, what string, explain func([]porcupine.Operation) string) {
	t.Helper()
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(m, ops, 20*time.Second)
	switch res {
	case porcupine.Ok:
		t.Logf("%s: %d operations linearizable (checked in %s)", what, len(ops), time.Since(began).Round(time.Millisecond))
		return
	case porcupine.Unknown:
		t.Logf("%s: linearizability check of %d operations timed out; not judged", what, len(ops))
		return
	}
	for _, part := range m.Partition(ops) {
		if porcupine.CheckOperations(m, part) {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		var b strings.Builder
		for _, op := range part {
			ret := "never"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%.3fs", float64(op.Return)/1e9)
			}
			fmt.Fprintf(&b, "\n  %.3fs..%s client %d: %s", float64(op.Call)/1e9, ret, op.ClientId, m.DescribeOperation(op.Input, op.Output))
		}
		t.Errorf("%s: this history of %d operations is not linearizable:%s", what, len(part), b.String())
		if explain != nil {
			t.Log(explain(part))
		}
		break
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("stockd-nemesis-%s-%d.html", what, time.Now().UnixNano()))
	if err := porcupine.VisualizePath(m, info, path); err == nil {
		t.Logf("%s: porcupine's view of the check: %s", what, path)
	}
	t.FailNow()
}

// tvModel is SKUs with a per-user limit and no way for a unit to come
// back, each checked on its own: a SKU's state is its units left, each
// user's wins and which buyers (request ids) won, packed in a string so
// that states compare cheaply.
func tvModel(units, users, buyers, perUser int) porcupine.Model {
	const head = 4 // units left, uint32
	userAt := func(u int) int { return head + u }
	bitAt := func(b int) (int, byte) { return head + users + b/8, 1 << (b % 8) }
	left := func(s string) int {
		return int(s[0]) | int(s[1])<<8 | int(s[2])<<16 | int(s[3])<<24
	}
	win := func(s string, in tvIn) string {
		b := []byte(s)
		n := left(s) - 1
		b[0], b[1], b[2], b[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		b[userAt(in.user)]++
		i, bit := bitAt(in.buyer)
		b[i] |= bit
		return string(b)
	}
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(history, func(op porcupine.Operation) any { return op.Input.(tvIn).sku })
		},
		Init: func() []any {
			b := make([]byte, head+users+(buyers+7)/8)
			b[0], b[1], b[2], b[3] = byte(units), byte(units>>8), byte(units>>16), byte(units>>24)
			return []any{string(b)}
		},
		Step: func(state, input, output any) []any {
			s, in, out := state.(string), input.(tvIn), output.(tvOut)
			if in.read {
				if units-left(s) == out.sold {
					return []any{s}
				}
				return nil
			}
			i, bit := bitAt(in.buyer)
			won := s[i]&bit != 0
			canWin := !won && left(s) > 0 && int(s[userAt(in.user)]) < perUser
			switch out.result {
			case "won":
				if won {
					return []any{s} // a repeat of a win
				}
				if canWin {
					return []any{win(s, in)}
				}
			case "sold_out":
				if !won && left(s) == 0 {
					return []any{s}
				}
			case "user_limit":
				if !won && int(s[userAt(in.user)]) >= perUser {
					return []any{s}
				}
			case "unknown":
				if canWin {
					return []any{s, win(s, in)}
				}
				return []any{s}
			}
			return nil
		},
		Equal: func(a, b any) bool { return a.(string) == b.(string) },
		DescribeOperation: func(input, output any) string {
			in, out := input.(tvIn), output.(tvOut)
			if in.read {
				return fmt.Sprintf("tv%d read sold=%d", in.sku, out.sold)
			}
			return fmt.Sprintf("tv%d deduct buyer %d user %d -> %s", in.sku, in.buyer, in.user, out.result)
		},
	}
	return nm.ToModel()
}

// partitionBy splits a history into independent ones by key, in the order
// keys first appear.
func partitionBy(history []porcupine.Operation, key func(porcupine.Operation) any) [][]porcupine.Operation {
	index := map[any]int{}
	var out [][]porcupine.Operation
	for _, op := range history {
		k := key(op)
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], op)
	}
	return out
}

// holdModel is one held order's life: held, then sold (confirm), or
// released by a cancel or by the janitor's expiry. Orders are independent,
// so the history is checked order by order.
func holdModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(history, func(op porcupine.Operation) any { return op.Input.(holdIn).order })
		},
		Init: func() []any { return []any{"held"} },
		DescribeOperation: func(input, output any) string {
			in, out := input.(holdIn), output.(holdOut)
			return fmt.Sprintf("%s %s -> %s", in.op, in.order, out.result)
		},
		Step: func(state, input, output any) []any {
			s, in, out := state.(string), input.(holdIn), output.(holdOut)
			switch in.op + "/" + out.result {
			case "expire/ok":
				if s == "held" {
					return []any{"expired"}
				}
				return []any{s}
			case "confirm/ok":
				if s == "held" || s == "sold" {
					return []any{"sold"}
				}
			case "confirm/expired":
				if s == "expired" {
					return []any{s}
				}
			case "confirm/invalid_state":
				if s == "cancelled" {
					return []any{s}
				}
			case "confirm/unknown":
				if s == "held" {
					return []any{s, "sold", "expired"}
				}
				return []any{s}
			case "cancel/ok":
				switch s {
				case "held":
					return []any{"cancelled"}
				case "cancelled", "expired":
					return []any{s}
				}
			case "cancel/invalid_state":
				if s == "sold" {
					return []any{s}
				}
			case "cancel/unknown":
				if s == "held" {
					return []any{s, "cancelled"}
				}
				return []any{s}
			}
			return nil
		},
		Equal: func(a, b any) bool { return a.(string) == b.(string) },
	}
	return nm.ToModel()
}

// maxOverlap returns the most operations in flight at one instant (the
// whole history, not per partition) and the longest one.
func maxOverlap(ops []porcupine.Operation) (int, time.Duration) {
	type ev struct {
		t int64
		d int
	}
	var evs []ev
	var longest int64
	for _, op := range ops {
		evs = append(evs, ev{op.Call, 1}, ev{op.Return, -1})
		longest = max(longest, op.Return-op.Call)
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Compare(a.t, b.t)*2 + cmp.Compare(a.d, b.d) })
	cur, best := 0, 0
	for _, e := range evs {
		cur += e.d
		best = max(best, cur)
	}
	return best, time.Duration(longest)
}
