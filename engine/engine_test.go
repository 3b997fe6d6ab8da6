package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftnode"
	"stockd.dev/stockd/stock"
)

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) { w.tb.Log(string(p)); return len(p), nil }

// testNode is an engine over a real single-node raft ledger in a temp dir.
type testNode struct {
	t      *testing.T
	dir    string
	ledger *raftfsm.Ledger
	node   *raftnode.Node
	engine *Engine
}

func startTestNode(t *testing.T, dir string, tune func(*Config)) *testNode {
	t.Helper()
	return startTestNodeWith(t, dir, tune, nil)
}

// startTestNodeWith is startTestNode with the engine's proposer wrapped by
// wrap (nil: the raft node itself).
func startTestNodeWith(t *testing.T, dir string, tune func(*Config), wrap func(Proposer) Proposer) *testNode {
	t.Helper()
	return startTestNodeWrapped(t, dir, tune, wrap, nil)
}

// startTestNodeWrapped is startTestNodeWith with the ledger the engine
// reads wrapped by wrapLedger (nil: the ledger itself).
func startTestNodeWrapped(t *testing.T, dir string, tune func(*Config), wrap func(Proposer) Proposer, wrapLedger func(*raftfsm.Ledger) Ledger) *testNode {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(tbWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ledger, err := raftfsm.OpenLedger(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Logger = logger
	if tune != nil {
		tune(&cfg)
	}
	var read Ledger = ledger
	if wrapLedger != nil {
		read = wrapLedger(ledger)
	}
	e, err := New(cfg, read)
	if err != nil {
		t.Fatal(err)
	}
	rc := raftnode.DefaultConfig()
	rc.Dir, rc.RaftBind, rc.Logger = dir, "127.0.0.1:0", logger
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	node, err := raftnode.StartNode(rc, ledger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := node.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := node.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	var proposer Proposer = raftProposer{node}
	if wrap != nil {
		proposer = wrap(proposer)
	}
	e.Start(proposer)
	tn := &testNode{t: t, dir: dir, ledger: ledger, node: node, engine: e}
	t.Cleanup(tn.stop)
	return tn
}

// raftProposer proposes straight to a raft node, its errors mapped onto
// the engine's sentinels as node's Proposer maps them (the engine itself
// reads nothing but its own).
type raftProposer struct{ n *raftnode.Node }

func (p raftProposer) Propose(at int64, c command.Command) (*command.Result, error) {
	res, err := p.n.Propose(at, c)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, raftnode.ErrOutcomeUnknown):
		return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.Is(err, raftfsm.ErrMalformed):
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	default:
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

func (tn *testNode) stop() {
	if tn.engine == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tn.engine.Close(ctx); err != nil {
		tn.t.Errorf("close engine: %v", err)
	}
	if err := tn.node.Close(); err != nil {
		tn.t.Errorf("close node: %v", err)
	}
	if err := tn.ledger.Close(); err != nil {
		tn.t.Errorf("close ledger: %v", err)
	}
	tn.engine = nil
}

func (tn *testNode) deduct(sku, user, requestID string, qty int64, noWait bool) DeductResult {
	req := DeductRequest{SKU: []byte(sku), User: []byte(user), RequestID: []byte(requestID), Qty: qty, NoWait: noWait}
	var res DeductResult
	tn.engine.Deduct(&req, &res)
	return res
}

// checkLedger asserts the conservation law and the order recount, and
// returns the audit.
func (tn *testNode) checkLedger(sku string) stock.Audit {
	tn.t.Helper()
	a, _, ok, err := tn.engine.Audit(sku)
	if err != nil || !ok || !a.OK {
		tn.t.Fatalf("audit %s: ok=%v err=%v audit=%+v", sku, ok, err, a)
	}
	return a
}

func TestEngine_ConcurrentBuyersNeverOversell(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	const units, buyers, workers = 300, 3000, 64
	if _, err := tn.engine.CreateSale("hot", SaleSpec{Total: units}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	orders := map[string]string{}
	counts := map[Status]int{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for b := w; b < buyers; b += workers {
				res := tn.deduct("hot", fmt.Sprintf("u%d", b), fmt.Sprintf("r%d", b), 1, false)
				mu.Lock()
				counts[res.Status]++
				if res.Status == StatusOK {
					if prev, dup := orders[res.Order.ID]; dup {
						t.Errorf("order %s given to %s and %s", res.Order.ID, prev, res.Order.User)
					}
					orders[res.Order.ID] = res.Order.User
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if counts[StatusOK] != units || counts[StatusSoldOut] != buyers-units {
		t.Fatalf("outcomes %v, want %d ok and %d sold_out", counts, units, buyers-units)
	}
	a := tn.checkLedger("hot")
	if a.Row.Sold != units || a.Orders != units {
		t.Fatalf("ledger sold %d in %d orders, want %d", a.Row.Sold, a.Orders, units)
	}
	if res := tn.deduct("hot", "late", "", 1, false); res.Status != StatusSoldOut {
		t.Fatalf("deduct after sell-out: %s", res.Status)
	}
	// A restock after the sell-out clears the flag and sells again.
	if err := tn.engine.Restock("hot", 5); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if res := tn.deduct("hot", fmt.Sprintf("again-%d", i), "", 1, false); res.Status != StatusOK {
			t.Fatalf("deduct %d after restock: %s %s", i, res.Status, res.Detail)
		}
	}
	if res := tn.deduct("hot", "late", "", 1, false); res.Status != StatusSoldOut {
		t.Fatalf("deduct after the restock sold out: %s", res.Status)
	}
	if a := tn.checkLedger("hot"); a.Row.Sold != units+5 || a.Row.Total != units+5 {
		t.Fatalf("after restock: %+v", a.Row)
	}
}

func TestEngine_RequestIDAnswersTheSameTwice(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 10}); err != nil {
		t.Fatal(err)
	}
	first := tn.deduct("a", "u1", "req-1", 1, false)
	again := tn.deduct("a", "u1", "req-1", 1, false)
	if first.Status != StatusOK || again.Status != StatusOK || first.Order.ID != again.Order.ID {
		t.Fatalf("first %s %q, again %s %q", first.Status, first.Order.ID, again.Status, again.Order.ID)
	}
	// Concurrent duplicates collapse into one order too.
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ids[i] = tn.deduct("a", "u2", "req-2", 1, false).Order.ID
		}(i)
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("concurrent duplicates got orders %v", ids)
		}
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 2 {
		t.Fatalf("sold %d, want 2", a.Row.Sold)
	}
}

func TestEngine_WaitNoneOrderBecomesSold(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	res := tn.deduct("a", "u1", "r1", 2, true)
	if res.Status != StatusAccepted || res.Order.ID == "" {
		t.Fatalf("wait=none deduct: %+v", res)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, ok, err := tn.engine.Order(res.Order.ID)
		if err != nil || !ok {
			t.Fatalf("order %s: ok=%v err=%v", res.Order.ID, ok, err)
		}
		if o.State == stock.OrderSold {
			break
		}
		if o.State != stock.OrderPending || time.Now().After(deadline) {
			t.Fatalf("order state %s", o.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 2 {
		t.Fatalf("sold %d, want 2", a.Row.Sold)
	}
}

func TestEngine_Gates(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	start := time.Now().Add(time.Hour)
	if _, err := tn.engine.CreateSale("later", SaleSpec{Total: 5, StartAt: start}); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.engine.CreateSale("limited", SaleSpec{Total: 5, PerUser: 1}); err != nil {
		t.Fatal(err)
	}
	f := func(sku, user string, qty int64, want Status) {
		t.Helper()
		if got := tn.deduct(sku, user, "", qty, false); got.Status != want {
			t.Fatalf("deduct %s qty %d: %s (%s), want %s", sku, qty, got.Status, got.Detail, want)
		}
	}
	f("later", "u1", 1, StatusNotStarted)
	f("nope", "u1", 1, StatusUnknownSKU)
	f("limited", "u1", 0, StatusBadRequest)
	f("limited", "u1", MaxQtyPerDeduct+1, StatusBadRequest)
	f("limited", "u1", 1, StatusOK)
	f("limited", "u1", 1, StatusUserLimit)
	f("limited", "u2", 1, StatusOK)
	a := tn.checkLedger("limited")
	if a.Row.Sold != 2 {
		t.Fatalf("sold %d, want 2", a.Row.Sold)
	}
	// The unit the ledger turned down went back to this node's buckets.
	_, local, _, _ := tn.engine.Audit("limited")
	if !local.OK {
		t.Fatalf("local law broken: %+v", local)
	}
}

func TestEngine_RestartKeepsSalesAndLeases(t *testing.T) {
	dir := t.TempDir()
	tn := startTestNode(t, dir, nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 40}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if r := tn.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false); r.Status != StatusOK {
			t.Fatalf("deduct %d: %s", i, r.Status)
		}
	}
	tn.stop()

	tn2 := startTestNode(t, dir, nil)
	if r := tn2.deduct("a", "u0", "r0", 1, false); r.Status != StatusOK {
		t.Fatalf("repeat after restart: %s", r.Status)
	}
	n := 0
	for i := 10; ; i++ {
		r := tn2.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false)
		if r.Status == StatusSoldOut {
			break
		}
		if r.Status != StatusOK || i > 100 {
			t.Fatalf("deduct %d after restart: %s %s", i, r.Status, r.Detail)
		}
		n++
	}
	if n != 30 {
		t.Fatalf("sold %d after restart, want the 30 left", n)
	}
	if a := tn2.checkLedger("a"); a.Row.Sold != 40 || a.Row.Available != 0 || a.Row.LeasedTotal() != 0 {
		t.Fatalf("row %+v", a.Row)
	}
}

func TestEngine_SoldOutDeductDoesNotAllocate(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 1}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("a", "first", "r-first", 1, false); r.Status != StatusOK {
		t.Fatalf("first deduct: %s", r.Status)
	}
	req := DeductRequest{SKU: []byte("a"), User: []byte("u-loser"), RequestID: []byte("request-id-longer-than-32-bytes-0001"), Qty: 1, Hint: 3}
	var res DeductResult
	tn.engine.Deduct(&req, &res) // sets the sold-out flag
	allocs := testing.AllocsPerRun(1000, func() { tn.engine.Deduct(&req, &res) })
	if res.Status != StatusSoldOut {
		t.Fatalf("status %s", res.Status)
	}
	if allocs > 0 && !raceEnabled {
		t.Fatalf("sold-out deduct allocates %.1f times", allocs)
	}
	tn.checkLedger("a")
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestEngine_TurnedDownPendingOrderIsReadable: a wait=none take the ledger
// refuses (here the per-user limit, hit by two concurrent takes) leaves an
// order the buyer can still read, as released with the reason.
func TestEngine_TurnedDownPendingOrderIsReadable(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 10, PerUser: 1}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]DeductResult, 8)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = tn.deduct("a", "same-user", fmt.Sprintf("r%d", i), 1, true)
		}(i)
	}
	wg.Wait()
	sold, turnedDown := 0, 0
	for _, r := range results {
		if r.Status != StatusAccepted {
			continue // refused before the stock by the pre-check
		}
		waitUntil(t, "order "+r.Order.ID+" settles", func() bool {
			o, ok, _ := tn.engine.Order(r.Order.ID)
			return ok && o.State != stock.OrderPending
		})
		o, _, _ := tn.engine.Order(r.Order.ID)
		switch {
		case o.State == stock.OrderSold:
			sold++
		case o.State == stock.OrderReleased && o.ReleaseReason == "turned_down_user_limit":
			turnedDown++
		default:
			t.Fatalf("order %s: %s %q", o.ID, o.State, o.ReleaseReason)
		}
	}
	if sold != 1 {
		t.Fatalf("%d sold, %d turned down: want exactly 1 sold", sold, turnedDown)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 1 {
		t.Fatalf("ledger sold %d", a.Row.Sold)
	}
	t.Logf("%d accepted orders turned down by the ledger", turnedDown)
}

// TestEngine_IdleReturnRepairsTheLocalLaw empties a node's buckets behind
// the ledger's back (as a lost update would): once the sale is idle the
// node returns the whole lease, and buyers can have the units again.
func TestEngine_IdleReturnRepairsTheLocalLaw(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), func(c *Config) { c.LeaseIdleReturn = 100 * time.Millisecond })
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 20}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("a", "u0", "r0", 1, false); r.Status != StatusOK {
		t.Fatalf("deduct: %s", r.Status)
	}
	s := tn.engine.lookupSale([]byte("a"))
	lost := s.buckets.Drain()
	if lost == 0 {
		t.Fatal("no units were leased to the node")
	}
	waitUntil(t, "the idle lease goes back to the ledger", func() bool {
		row, _, _ := tn.ledger.SKU("a")
		return row.LeasedTotal() == 0
	})
	if _, local, _, _ := tn.engine.Audit("a"); !local.OK {
		t.Fatalf("local law still broken: %+v", local)
	}
	for i := 1; i < 20; i++ {
		if r := tn.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false); r.Status != StatusOK {
			t.Fatalf("deduct %d after the repair: %s %s", i, r.Status, r.Detail)
		}
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 20 {
		t.Fatalf("sold %d of 20: units stayed stranded", a.Row.Sold)
	}
}

// laggingReturns answers Return proposals as the leader would while this
// node's ledger lags far behind: committed at an index not applied here.
type laggingReturns struct {
	Proposer
	returns atomic.Int64
}

func (p *laggingReturns) Propose(at int64, c command.Command) (*command.Result, error) {
	if _, ok := c.(*command.Return); ok {
		p.returns.Add(1)
		return &command.Result{Outcome: stock.OutcomeOK, Index: 1 << 40}, nil
	}
	return p.Proposer.Propose(at, c)
}

// TestEngine_LaggingNodeReturnsAnIdleLeaseOnce: a node whose ledger lags
// reads a stale lease and used to propose the same idle Return at every
// janitor tick (the nemesis saw a 37,000-entry storm from one stuck
// follower). No second Return goes out before the first is applied here.
func TestEngine_LaggingNodeReturnsAnIdleLeaseOnce(t *testing.T) {
	p := &laggingReturns{}
	tn := startTestNodeWith(t, t.TempDir(), func(c *Config) { c.LeaseIdleReturn = 50 * time.Millisecond },
		func(inner Proposer) Proposer { p.Proposer = inner; return p })
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 20}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("a", "u0", "r0", 1, false); r.Status != StatusOK {
		t.Fatalf("deduct: %s", r.Status)
	}
	waitUntil(t, "the idle lease proposed back", func() bool { return p.returns.Load() > 0 })
	// Absence over many janitor ticks is what this asserts: the wait is
	// the observation window, not a synchronisation.
	time.Sleep(20 * janitorTick)
	if n := p.returns.Load(); n != 1 {
		t.Fatalf("%d Returns proposed for one stale lease, want 1", n)
	}
}

// farAhead is a log index this node never applies.
const farAhead = 1 << 40

// takesCommittedElsewhere answers take batches as a leader would while
// this node's ledger is cut off from the log (a node just removed from
// the cluster): committed at an index never applied here.
type takesCommittedElsewhere struct{ Proposer }

func (p takesCommittedElsewhere) Propose(at int64, c command.Command) (*command.Result, error) {
	res, err := p.Proposer.Propose(at, c)
	if _, ok := c.(*command.Take); ok && err == nil {
		moved := *res
		moved.Index = farAhead
		return &moved, nil
	}
	return res, err
}

// waitsRecorded records how waits for an index never applied here ended.
type waitsRecorded struct {
	*raftfsm.Ledger
	mu    sync.Mutex
	ended []error
}

func (l *waitsRecorded) WaitApplied(ctx context.Context, index uint64) error {
	if index < farAhead {
		return l.Ledger.WaitApplied(ctx, index)
	}
	<-ctx.Done()
	l.mu.Lock()
	l.ended = append(l.ended, ctx.Err())
	l.mu.Unlock()
	return ctx.Err()
}

// TestEngine_CloseDoesNotWaitForBatchesItWillNeverApply: a node removed
// from the cluster while buyers were on it has batches committed at
// indexes it will never apply. Stopping it waited out each batch's apply
// wait (5 s) instead of ending at once (the nemesis's remove-join found
// the crash of such a node taking 5 s).
func TestEngine_CloseDoesNotWaitForBatchesItWillNeverApply(t *testing.T) {
	var waits *waitsRecorded
	tn := startTestNodeWrapped(t, t.TempDir(), nil,
		func(inner Proposer) Proposer { return takesCommittedElsewhere{inner} },
		func(l *raftfsm.Ledger) Ledger { waits = &waitsRecorded{Ledger: l}; return waits })
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 20}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := tn.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false); r.Status != StatusOK {
			t.Fatalf("deduct: %s", r.Status)
		}
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 3 {
		t.Fatalf("sold %d, want the 3 orders once each", a.Row.Sold)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a crash: nothing is drained
	if err := tn.engine.Close(ctx); !errors.Is(err, ErrDrainIncomplete) {
		t.Fatalf("close: %v, want ErrDrainIncomplete (the takes are not applied here)", err)
	}
	tn.engine = nil
	tn.node.Close()
	tn.ledger.Close()
	waits.mu.Lock()
	defer waits.mu.Unlock()
	if len(waits.ended) == 0 {
		t.Fatal("no wait for the batches' index: the test does not test what it says")
	}
	for _, err := range waits.ended {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a wait for an index never applied here ended with %v, want it cancelled by Close", err)
		}
	}
}

// TestEngine_LeaderLingersOnlyInACluster: a leader alone proposes its
// batches at once (waiting only cost throughput there); in a cluster, and
// while following, a batch under load waits its linger for more takes.
func TestEngine_LeaderLingersOnlyInACluster(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), func(c *Config) {
		c.ProposeLinger, c.ForwardLinger = 3*time.Millisecond, 2*time.Millisecond
	})
	e := tn.engine
	if _, err := e.propose(&command.Register{Node: e.cfg.NodeID, Addr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if d := e.lingerFor(e.localSlots); d != 0 {
		t.Fatalf("a node alone lingers %s, want 0", d)
	}
	if d := e.lingerFor(e.forwardSlots); d != 2*time.Millisecond {
		t.Fatalf("forwarding lingers %s, want the forward linger", d)
	}
	if _, err := e.propose(&command.Register{Node: "n2", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if d := e.lingerFor(e.localSlots); d != 3*time.Millisecond {
		t.Fatalf("a leader with a peer lingers %s, want the propose linger", d)
	}
}

// switchableCluster is a one-node cluster whose leader can vanish.
type switchableCluster struct{ healthy atomic.Bool }

func (c *switchableCluster) IsLeader() bool                    { return true }
func (c *switchableCluster) CommitHealthy() bool               { return c.healthy.Load() }
func (c *switchableCluster) Unreachable() map[string]time.Time { return nil }
func (c *switchableCluster) MemberIDs() ([]string, error)      { return []string{"n1"}, nil }
func (c *switchableCluster) VotersKnowRules(uint64) bool       { return true }

// LeaseReadIndex is ReadIndex: alone, there is no quorum to ask.
func (c *switchableCluster) LeaseReadIndex(ctx context.Context) (uint64, error) {
	return c.ReadIndex(ctx)
}

// ReadIndex: alone, the node's own ledger holds every write.
func (c *switchableCluster) ReadIndex(context.Context) (uint64, error) {
	if !c.healthy.Load() {
		return 0, errors.New("no leader")
	}
	return 0, nil
}

// takesHang never answers a Take until released: a commit that cannot
// happen (the quorum is gone).
type takesHang struct {
	Proposer
	release chan struct{}
}

func (p takesHang) Propose(at int64, c command.Command) (*command.Result, error) {
	if _, ok := c.(*command.Take); ok {
		<-p.release
		return nil, fmt.Errorf("%w: released by the test", ErrUnavailable)
	}
	return p.Proposer.Propose(at, c)
}

// TestEngine_StoppingWithoutALeaderAnswersWaitingBuyers: a node stopping
// after the rest of its cluster (so no leader is reachable) answers the
// buyers waiting for a commit with outcome_unknown within a moment, not at
// their commit wait (here an hour). The last node of a cluster stopped all
// at once took 6 s to stop, its HTTP server waiting for them.
func TestEngine_StoppingWithoutALeaderAnswersWaitingBuyers(t *testing.T) {
	cluster := &switchableCluster{}
	cluster.healthy.Store(true)
	hang := takesHang{release: make(chan struct{})}
	tn := startTestNodeWith(t, t.TempDir(), func(c *Config) { c.Cluster, c.CommitWait = cluster, time.Hour },
		func(inner Proposer) Proposer { hang.Proposer = inner; return hang })
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hang.release) }) }
	t.Cleanup(release) // runs before the node's stop: a failed test does not hang in it
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	answer := make(chan DeductResult, 1)
	go func() { answer <- tn.deduct("a", "u1", "r1", 1, false) }()
	waitUntil(t, "the take in flight", func() bool { return tn.engine.pendingOrd.len() == 1 })
	cluster.healthy.Store(false) // the others stopped: no leader
	tn.engine.BeginDrain()
	select {
	case r := <-answer:
		if r.Status != StatusOutcomeUnknown || r.Order.ID == "" {
			t.Fatalf("the waiting buyer got %s (order %q), want outcome_unknown with its order id", r.Status, r.Order.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting buyer got no answer while the node stops without a leader")
	}
	// The unit of the take that never committed is still leased here:
	// the law holds and nothing was sold.
	if a := tn.checkLedger("a"); a.Row.Sold != 0 || a.Row.Leased[tn.engine.cfg.NodeID] == 0 {
		t.Fatalf("after the lost commit: sold %d, leased here %d", a.Row.Sold, a.Row.Leased[tn.engine.cfg.NodeID])
	}
	release() // the proposal fails: Close must not wait on it forever
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tn.engine.Close(ctx); !errors.Is(err, ErrDrainIncomplete) {
		t.Fatalf("close: %v, want ErrDrainIncomplete (the take never committed)", err)
	}
	tn.engine = nil
	tn.node.Close()
	tn.ledger.Close()
}

// upgradingCluster is a one-node cluster whose other voters (by its word)
// run a binary that may not know the newest ledger rules yet.
type upgradingCluster struct {
	switchableCluster
	votersKnow atomic.Bool
	asked      atomic.Int64
}

func (c *upgradingCluster) VotersKnowRules(uint64) bool {
	c.asked.Add(1)
	return c.votersKnow.Load()
}

// startUpgradingWithAlice starts a node whose voters do not know the
// newest rules (its ledger keeps the first ones) with sale "a" of 10
// units, of which alice bought one with request id r-1.
func startUpgradingWithAlice(t *testing.T) (*testNode, *upgradingCluster, DeductResult) {
	t.Helper()
	cluster := &upgradingCluster{}
	cluster.healthy.Store(true)
	tn := startTestNode(t, t.TempDir(), func(c *Config) { c.Cluster = cluster })
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 10}); err != nil {
		t.Fatal(err)
	}
	first := tn.deduct("a", "alice", "r-1", 1, false)
	if first.Status != StatusOK {
		t.Fatalf("alice: %s", first.Status)
	}
	return tn, cluster, first
}

// TestEngine_RulesSwitchOnlyOnceEveryVoterKnowsThem: during a rolling
// upgrade the ledger keeps its rules (request ids global: the id names
// alice's order whoever sends it), but no answer hands alice's order to
// bob: he gets request_id_reused and nothing is sold to him. Once every
// voter knows the new rules the leader switches them through the log, and
// the same call is then another user's own request.
func TestEngine_RulesSwitchOnlyOnceEveryVoterKnowsThem(t *testing.T) {
	tn, cluster, first := startUpgradingWithAlice(t)
	waitUntil(t, "the janitor asks the voters three times", func() bool { return cluster.asked.Load() >= 3 })
	if r := tn.ledger.Rules(); r != raftfsm.RulesGlobalRequestIDs {
		t.Fatalf("rules switched to %d while a voter does not know them", r)
	}
	// The earlier rules: bob's r-1 names alice's order, which he is not
	// told of, whether the ledger answers (a repeat it knows) or the take
	// does (the ledger's answer to his take).
	for range 2 {
		if bob := tn.deduct("a", "bob", "r-1", 1, false); bob.Status != StatusRequestIDReused || bob.Order.ID != "" {
			t.Fatalf("bob's r-1 before the switch: %s %q, want request_id_reused and no order", bob.Status, bob.Order.ID)
		}
	}
	cluster.votersKnow.Store(true)
	waitUntil(t, "the rules switched", func() bool { return tn.ledger.Rules() == raftfsm.RulesCurrent })
	carol := tn.deduct("a", "carol", "r-1", 1, false)
	if carol.Status != StatusOK || carol.Order.ID == first.Order.ID || carol.Order.User != "carol" {
		t.Fatalf("carol's r-1 after the switch: %s %+v", carol.Status, carol.Order)
	}
	if again := tn.deduct("a", "alice", "r-1", 1, false); again.Order.ID != first.Order.ID {
		t.Fatalf("alice's repeat after the switch: %s %s", again.Status, again.Order.ID)
	}
	if reused := tn.deduct("a", "alice", "r-1", 2, false); reused.Status != StatusRequestIDReused {
		t.Fatalf("alice's r-1 for 2 units: %s", reused.Status)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 2 {
		t.Fatalf("sold %d, want 2 (alice, carol)", a.Row.Sold)
	}
}

// TestEngine_LegacyRulesTakeOfAnotherUsersIDIsRefused: under the rules
// before scoped request ids, a take whose id the ledger holds for another
// user comes back with that user's order; the engine answers
// request_id_reused instead and puts its unit back.
func TestEngine_LegacyRulesTakeOfAnotherUsersIDIsRefused(t *testing.T) {
	tn, _, first := startUpgradingWithAlice(t)
	p := &pendingTake{sale: tn.engine.lookupSale([]byte("a")), entry: command.TakeEntry{SKU: "a", User: "bob", RequestID: "r-1", Qty: 1, OrderID: "n1-x-1"}}
	before := p.sale.buckets.Units()
	tn.engine.settle(p, command.TakeResult{Outcome: stock.OutcomeSame, Order: first.Order}, instant{now: time.Now(), real: time.Now()})
	r, done := p.outcome()
	if !done || r.Status != StatusRequestIDReused || r.Order.ID != "" {
		t.Fatalf("bob's take answered %v %s %q, want request_id_reused and no order", done, r.Status, r.Order.ID)
	}
	if after := p.sale.buckets.Units(); after != before+1 {
		t.Fatalf("buckets %d after the refused take, want %d (its unit back)", after, before+1)
	}
}
