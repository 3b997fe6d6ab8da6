package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// refusingProposer stands for a leader with a smaller size limit than this
// node and a rule that one buyer's take is malformed: it refuses Take
// batches over maxEntries (ErrTooLarge) and any batch holding badUser's
// take (ErrRejected), and records every Take it was sent.
type refusingProposer struct {
	inner      Proposer
	maxEntries int
	badUser    string

	mu    sync.Mutex
	takes [][]string // order ids of every Take proposed, in order
}

func (p *refusingProposer) Propose(at int64, c command.Command) (*command.Result, error) {
	take, ok := c.(*command.Take)
	if !ok {
		return p.inner.Propose(at, c)
	}
	ids := make([]string, len(take.Entries))
	bad := false
	for i, e := range take.Entries {
		ids[i] = e.OrderID
		bad = bad || e.User == p.badUser
	}
	p.mu.Lock()
	p.takes = append(p.takes, ids)
	p.mu.Unlock()
	switch {
	case len(take.Entries) > p.maxEntries:
		return nil, fmt.Errorf("%w: %d entries", ErrTooLarge, len(take.Entries))
	case bad:
		return nil, fmt.Errorf("%w: a take of %s", ErrRejected, p.badUser)
	}
	return p.inner.Propose(at, c)
}

func TestEngine_RefusedBatchesAreSplitNeverResentUnchanged(t *testing.T) {
	rp := &refusingProposer{maxEntries: 8, badUser: "u13"}
	tn := startTestNodeWith(t, t.TempDir(), nil, func(inner Proposer) Proposer {
		rp.inner = inner
		return rp
	})
	const buyers = 400
	if _, err := tn.engine.CreateSale("tv", SaleSpec{Total: buyers}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]DeductResult, buyers)
	for b := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[b] = tn.deduct("tv", fmt.Sprintf("u%d", b), fmt.Sprintf("r%d", b), 1, false)
		}()
	}
	wg.Wait()
	won := 0
	for b, r := range results {
		switch {
		case b == 13:
			if r.Status != StatusUnavailable || !strings.Contains(r.Detail, "refused") {
				t.Fatalf("the refused buyer got %s %q, want unavailable: refused", r.Status, r.Detail)
			}
		case r.Status != StatusOK:
			t.Fatalf("buyer %d got %s %q, want ok", b, r.Status, r.Detail)
		default:
			won++
		}
	}
	// The refused unit went back: everything but it is sold, and it can
	// still be sold.
	a := tn.checkLedger("tv")
	if a.Row.Sold != int64(won) || won != buyers-1 {
		t.Fatalf("sold %d, won %d, want %d", a.Row.Sold, won, buyers-1)
	}
	if r := tn.deduct("tv", "late", "late", 1, false); r.Status != StatusOK {
		t.Fatalf("the unit of the refused take: %s %q", r.Status, r.Detail)
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	seen := map[string]bool{}
	split := false
	for _, ids := range rp.takes {
		key := strings.Join(ids, ",")
		if seen[key] {
			t.Fatalf("batch %v was proposed twice", ids)
		}
		seen[key] = true
		split = split || len(ids) > rp.maxEntries
	}
	if !split {
		t.Fatalf("no batch ever exceeded %d entries: the test did not exercise a refusal (%d proposals)", rp.maxEntries, len(rp.takes))
	}
	if !slices.ContainsFunc(rp.takes, func(ids []string) bool { return len(ids) == 1 }) {
		t.Fatal("no single take was ever proposed: the refusal was not narrowed down")
	}
}

// abandon is the committer's answer, at a stop, for the take it holds
// waiting for a proposal slot. A take never proposed gives its unit back
// and is answered 503 (nothing happened). A take back for a retry, after
// a proposal whose outcome the proposer could not tell, may have
// committed: it is answered outcome_unknown with its order, and its unit
// stays out of the buckets. It was answered 503 too, and the nemesis test
// (seed 466538829, three nodes) caught a buyer told 503 "node is shutting
// down" for a unit the ledger had sold it.
func TestEngine_AbandonAtStopNeverDeniesAProposedTake(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	e := tn.engine
	if _, err := e.CreateSale("a", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	if res := tn.deduct("a", "u0", "r0", 1, false); res.Status != StatusOK {
		t.Fatalf("a deduct before the stop: %s", res.Status)
	}
	s := e.lookupSale([]byte("a"))
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	held := func(user string, attempts int) *pendingTake {
		req := DeductRequest{SKU: []byte("a"), User: []byte(user), RequestID: []byte("r1"), Qty: 1}
		p := e.newPendingTake(s, &req)
		p.entry.OrderID = e.nextOrderID()
		p.markTaken()
		p.attempts = attempts
		s.takesInFlight.Add(1)
		return p
	}
	units := s.buckets.Units()
	retried := held("u1", 1)
	e.abandon(retried)
	r, done := retried.outcome()
	if !done || r.Status != StatusOutcomeUnknown || r.Order.ID != retried.entry.OrderID {
		t.Fatalf("a take proposed before the stop: answered %v %s with order %q; want outcome_unknown with order %q",
			done, r.Status, r.Order.ID, retried.entry.OrderID)
	}
	if got := s.buckets.Units(); got != units {
		t.Fatalf("its unit went back to the buckets (%d units, were %d): it may be sold", got, units)
	}
	fresh := held("u2", 0)
	e.abandon(fresh)
	if r, done := fresh.outcome(); !done || r.Status != StatusUnavailable {
		t.Fatalf("a take never proposed: answered %v %s, want unavailable", done, r.Status)
	}
	if got := s.buckets.Units(); got != units+1 {
		t.Fatalf("a take never proposed left %d units in the buckets, want its unit back (%d)", got, units+1)
	}
	a, ok, err := tn.ledger.AuditSKU("a")
	if err != nil || !ok || !a.OK || a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("the ledger after the stop: ok=%v err=%v %+v; want its law and the one unit sold once", ok, err, a)
	}
}

// deductRefusedOnRetry starts a node whose proposer wrap makes (one that
// loses a take's first answer and refuses its retry), opens sale "a" of
// 3 units, and has u1 deduct one with request id r1: the answer must be
// outcome_unknown with its order (what says which case it is).
func deductRefusedOnRetry(t *testing.T, what string, wrap func(Proposer) Proposer) (*testNode, DeductResult) {
	t.Helper()
	tn := startTestNodeWith(t, t.TempDir(), nil, wrap)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 3}); err != nil {
		t.Fatal(err)
	}
	res := tn.deduct("a", "u1", "r1", 1, false)
	if res.Status != StatusOutcomeUnknown || res.Order.ID == "" {
		t.Fatalf("%s: %s %q order %q; want outcome_unknown with its order", what, res.Status, res.Detail, res.Order.ID)
	}
	return tn, res
}

// lostThenRefused commits the first Take it is sent and loses the answer
// (ErrOutcomeUnknown, as a forward whose reply timed out), then refuses
// every later Take for good (ErrRejected, as a new leader whose secret or
// version turns this node's forwards away).
type lostThenRefused struct {
	Proposer
	mu    sync.Mutex
	takes int
}

func (p *lostThenRefused) Propose(at int64, c command.Command) (*command.Result, error) {
	if _, ok := c.(*command.Take); !ok {
		return p.Proposer.Propose(at, c)
	}
	p.mu.Lock()
	p.takes++
	first := p.takes == 1
	p.mu.Unlock()
	if !first {
		return nil, fmt.Errorf("%w: the leader turns this node's takes away", ErrRejected)
	}
	if _, err := p.Proposer.Propose(at, c); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: the leader's answer was lost", ErrOutcomeUnknown)
}

// A take proposed again after an outcome the proposer could not tell, and
// then refused for good, was answered 503 "the leader refused this take"
// and its unit put back, though its first proposal had sold it: a false
// "nothing taken". It is answered outcome_unknown with its order, and a
// repeat of its request id reads the sale from the ledger.
func TestEngine_RefusedRetryOfACommittedTakeIsNotDenied(t *testing.T) {
	lp := &lostThenRefused{}
	tn, res := deductRefusedOnRetry(t, "a take sold by its first proposal, refused on its retry", func(inner Proposer) Proposer {
		lp.Proposer = inner
		return lp
	})
	lp.mu.Lock()
	takes := lp.takes
	lp.mu.Unlock()
	if takes < 2 {
		t.Fatalf("%d take proposals: the retry was never refused, the test did not exercise it", takes)
	}
	a := tn.checkLedger("a")
	if a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("the ledger sold %d units in %d orders; want the one unit of the first proposal", a.Row.Sold, a.OrdersSold)
	}
	again := tn.deduct("a", "u1", "r1", 1, false)
	if again.Status != StatusOK || again.Order.ID != res.Order.ID {
		t.Fatalf("a repeat of the request id: %s %q order %q; want ok with order %q", again.Status, again.Detail, again.Order.ID, res.Order.ID)
	}
}

// lateThenRefused loses the first Take it is sent without proposing it
// (ErrOutcomeUnknown, as a forward whose reply timed out while the
// leader still held the entry), refuses every later Take for good, and
// proposes the first one when the test calls commitLate: an earlier
// proposal that commits after its retry was refused.
type lateThenRefused struct {
	Proposer
	mu    sync.Mutex
	takes int
	held  command.Command
	at    int64
}

func (p *lateThenRefused) Propose(at int64, c command.Command) (*command.Result, error) {
	if _, ok := c.(*command.Take); !ok {
		return p.Proposer.Propose(at, c)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.takes++
	if p.takes > 1 {
		return nil, fmt.Errorf("%w: the leader turns this node's takes away", ErrRejected)
	}
	p.held, p.at = c, at
	return nil, fmt.Errorf("%w: the leader's answer was lost", ErrOutcomeUnknown)
}

func (p *lateThenRefused) commitLate(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	c, at := p.held, p.at
	p.mu.Unlock()
	if c == nil {
		t.Fatal("no take was held back: the test did not exercise a late commit")
	}
	if _, err := p.Proposer.Propose(at, c); err != nil {
		t.Fatalf("the late commit: %v", err)
	}
}

// The order of a take answered outcome_unknown after its retry was
// refused was read as 404 on its node, and then found once the first
// proposal committed late: an answer that did not stay true. It reads
// as pending until the ledger settles it, then as the ledger has it.
func TestEngine_OrderOfAnOpenFateIsPendingNotMissing(t *testing.T) {
	lp := &lateThenRefused{}
	tn, res := deductRefusedOnRetry(t, "a take lost, then refused on its retry", func(inner Proposer) Proposer {
		lp.Proposer = inner
		return lp
	})
	o, ok, err := tn.engine.Order(res.Order.ID)
	if err != nil || !ok || o.State != stock.OrderPending || o.User != "u1" || o.Qty != 1 {
		t.Fatalf("the open order before its late commit: %+v found %v err %v; want it pending, u1's, one unit", o, ok, err)
	}
	lp.commitLate(t)
	o, ok, err = tn.engine.Order(res.Order.ID)
	if err != nil || !ok || o.State == stock.OrderPending || o.State == stock.OrderReleased {
		t.Fatalf("the order after its late commit: %+v found %v err %v; want it won", o, ok, err)
	}
	again := tn.deduct("a", "u1", "r1", 1, false)
	if again.Status != StatusOK || again.Order.ID != res.Order.ID {
		t.Fatalf("a repeat of the request id: %s %q order %q; want ok with order %q", again.Status, again.Detail, again.Order.ID, res.Order.ID)
	}
	a := tn.checkLedger("a")
	if a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("the ledger sold %d units in %d orders; want the one unit of the late proposal", a.Row.Sold, a.OrdersSold)
	}
}
