package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
)

// A DeductAsync caller whose take never commits is answered once, at its
// commit wait, with outcome_unknown and its order id; the take's later
// failure does not answer it again.
func TestEngine_DeductAsyncAnswersOnceAtTheCommitWait(t *testing.T) {
	hang := takesHang{release: make(chan struct{})}
	tn := startTestNodeWith(t, t.TempDir(), func(c *Config) { c.CommitWait = 300 * time.Millisecond },
		func(inner Proposer) Proposer { hang.Proposer = inner; return hang })
	released := false
	release := func() {
		if !released {
			released = true
			close(hang.release)
		}
	}
	t.Cleanup(release)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	answers := make(chan DeductResult, 2)
	req := DeductRequest{SKU: []byte("a"), User: []byte("u1"), RequestID: []byte("r1"), Qty: 1}
	var res DeductResult
	if tn.engine.DeductAsync(&req, &res, func(r *DeductResult) { calls.Add(1); answers <- *r }) {
		t.Fatalf("answered at once (%s); want an answer from the ledger's side", res.Status)
	}
	clear(req.User) // the caller may reuse its bytes once DeductAsync returns
	start := time.Now()
	var r DeductResult
	select {
	case r = <-answers:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20 s after a commit wait of 300 ms")
	}
	if r.Status != StatusOutcomeUnknown || r.Order.ID == "" || r.Order.User != "u1" {
		t.Fatalf("got %s, order %+v; want outcome_unknown with the take's order", r.Status, r.Order)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("answered after %s", waited)
	}
	release() // the proposal fails now
	// The take never commits: Close gives up on its drain at the
	// deadline, and ends every wait.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tn.engine.Close(ctx)
	if n := calls.Load(); n != 1 {
		t.Fatalf("answered %d times, want once", n)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 0 {
		t.Fatalf("sold %d after a take that never committed", a.Row.Sold)
	}
}

// stalledReads is a one-node cluster whose read index waits until
// released: a leader far away, or none.
type stalledReads struct {
	switchableCluster
	release chan struct{}
}

func (c *stalledReads) LeaseReadIndex(ctx context.Context) (uint64, error) {
	return c.ReadIndex(ctx)
}

func (c *stalledReads) ReadIndex(ctx context.Context) (uint64, error) {
	select {
	case <-c.release:
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// A DeductAsync caller is not held up by a sale the node does not know
// yet (whose catch-up with the leader may take a round trip, or seconds
// without a leader): it returns at once, and answers unknown_sku once
// the catch-up is done. A deduct of a known sale meanwhile is answered
// as usual, and the law holds.
func TestEngine_DeductAsyncDoesNotWaitForACatchUp(t *testing.T) {
	cluster := &stalledReads{release: make(chan struct{})}
	cluster.healthy.Store(true)
	tn := startTestNodeWith(t, t.TempDir(), func(c *Config) { c.Cluster = cluster }, nil)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 1}); err != nil {
		t.Fatal(err)
	}
	answers := make(chan DeductResult, 2)
	answer := func(r *DeductResult) { answers <- *r }
	returned := make(chan bool)
	go func() {
		req := DeductRequest{SKU: []byte("ghost"), User: []byte("u1"), Qty: 1}
		var res DeductResult
		returned <- tn.engine.DeductAsync(&req, &res, answer)
		clear(req.SKU) // the caller may reuse its bytes
	}()
	select {
	case now := <-returned:
		if now {
			t.Fatal("an unknown sale was answered before its catch-up")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("DeductAsync waited for the catch-up with the leader")
	}
	req := DeductRequest{SKU: []byte("a"), User: []byte("u2"), Qty: 1}
	var res DeductResult
	if !tn.engine.DeductAsync(&req, &res, answer) {
		r := <-answers
		res = r
	}
	if res.Status != StatusOK {
		t.Fatalf("a deduct of a known sale during the catch-up: %s", res.Status)
	}
	close(cluster.release)
	select {
	case r := <-answers:
		if r.Status != StatusUnknownSKU {
			t.Fatalf("the unknown sale after its catch-up: %s, want unknown_sku", r.Status)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20 s after the catch-up was released")
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("want the one unit sold once: %+v", a)
	}
}

// takesGate holds every take until released, then proposes it: a slow
// commit that ends well.
type takesGate struct {
	Proposer
	release chan struct{}
}

func (p takesGate) Propose(at int64, c command.Command) (*command.Result, error) {
	if _, ok := c.(*command.Take); ok {
		<-p.release
	}
	return p.Proposer.Propose(at, c)
}

// A DeductAsync repeat of a request id whose first attempt awaits the
// ledger on this node returns at once (the event loop that calls it
// serves every other connection meanwhile) and is answered with the first
// attempt's order when it commits; a repeat that asks for another qty is
// told request_id_reused at once. It waited for the first attempt's
// commit inside admit, up to the commit wait (an hour here).
func TestEngine_DeductAsyncRepeatOfAPendingAttemptDoesNotBlock(t *testing.T) {
	gate := takesGate{release: make(chan struct{})}
	tn := startTestNodeWith(t, t.TempDir(), func(c *Config) { c.CommitWait, c.MaxInFlight = time.Hour, 100 },
		func(inner Proposer) Proposer { gate.Proposer = inner; return gate })
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate.release) }) }
	t.Cleanup(release)
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	answers := make(chan DeductResult, 3)
	answer := func(r *DeductResult) { answers <- *r }
	deduct := func(qty int64) (DeductResult, bool) {
		returned := make(chan bool, 1)
		var res DeductResult
		go func() {
			req := DeductRequest{SKU: []byte("a"), User: []byte("u1"), RequestID: []byte("r1"), Qty: qty}
			returned <- tn.engine.DeductAsync(&req, &res, answer)
		}()
		select {
		case now := <-returned:
			return res, now
		case <-time.After(20 * time.Second):
			t.Fatal("DeductAsync blocked for 20 s")
			return res, false
		}
	}
	if res, now := deduct(1); now {
		t.Fatalf("the first attempt was answered at once (%s); want it to await the ledger", res.Status)
	}
	// Without units in the buckets yet, the first attempt registers on
	// a goroutine of its own.
	waitUntil(t, "the first attempt pending", func() bool {
		_, ok := tn.engine.pendingReq.getBytes(raftfsm.AppendRequestKey(nil, []byte("u1"), []byte("r1")))
		return ok
	})
	if res, now := deduct(1); now {
		t.Fatalf("the repeat was answered at once (%s) while its first attempt awaits the ledger", res.Status)
	}
	if res, now := deduct(2); !now || res.Status != StatusRequestIDReused {
		t.Fatalf("a repeat for another qty: answered at once %v, %s; want request_id_reused at once", now, res.Status)
	}
	release()
	var orders []string
	for range 2 {
		select {
		case r := <-answers:
			if r.Status != StatusOK {
				t.Fatalf("answered %s after the commit, want ok", r.Status)
			}
			orders = append(orders, r.Order.ID)
		case <-time.After(20 * time.Second):
			t.Fatalf("%d answers 20 s after the commit, want 2", len(orders))
		}
	}
	if orders[0] != orders[1] {
		t.Fatalf("the attempt and its repeat got orders %v, want one", orders)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("want one unit sold once: %+v", a)
	}
	if n := tn.engine.admission.InFlight(); n != 0 {
		t.Fatalf("%d admission slots held after every answer, want 0", n)
	}
}
