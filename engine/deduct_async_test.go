package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
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
