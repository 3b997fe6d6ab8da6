package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// followerCluster is a cluster this node follows, by its word: every
// definite negative answer needs a window opened by a read index, which
// it counts, and which fails while cut is set.
type followerCluster struct {
	switchableCluster
	rounds atomic.Int64
	cut    atomic.Bool
}

func (c *followerCluster) IsLeader() bool               { return false }
func (c *followerCluster) MemberIDs() ([]string, error) { return []string{"n1", "n2", "n3"}, nil }
func (c *followerCluster) LeaseReadIndex(ctx context.Context) (uint64, error) {
	return c.ReadIndex(ctx)
}

func (c *followerCluster) ReadIndex(context.Context) (uint64, error) {
	c.rounds.Add(1)
	if c.cut.Load() {
		return 0, errors.New("no leader reached")
	}
	return 0, nil
}

// TestVouch_FollowerSoldOutNeedsAWindow: a follower says sold_out only
// inside a window a catch-up round opened; answers inside it cost no
// round; once the window has closed and no round succeeds, it answers 503
// instead of a sold_out it cannot vouch for, on both the blocking and the
// event loop's path.
func TestVouch_FollowerSoldOutNeedsAWindow(t *testing.T) {
	cluster := &followerCluster{}
	cluster.healthy.Store(true)
	tn := startTestNode(t, t.TempDir(), func(c *Config) { c.Cluster = cluster })
	if _, err := tn.engine.CreateSale("gone", SaleSpec{Total: 0}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("gone", "a", "r-a", 1, false); r.Status != StatusSoldOut {
		t.Fatalf("first deduct: %s %s", r.Status, r.Detail)
	}
	if n := cluster.rounds.Load(); n < 1 {
		t.Fatalf("sold_out answered after %d catch-up rounds, want one first", n)
	}
	// Inside the window: answered without waiting for a round.
	waits := tn.engine.metrics.catchUps.Load()
	for i := range 20 {
		if tn.engine.mono() >= tn.engine.vouchedUntil.Load()-int64(vouchFor)/2 {
			break // the window is closing: what follows is not "inside"
		}
		if r := tn.deduct("gone", "b", "r-b", 1, false); r.Status != StatusSoldOut {
			t.Fatalf("deduct %d inside the window: %s", i, r.Status)
		}
	}
	if got := tn.engine.metrics.catchUps.Load(); got != waits {
		t.Fatalf("%d deducts waited for a round inside the window", got-waits)
	}
	// Cut off: once the window closes no answer is sold_out.
	cluster.cut.Store(true)
	waitUntil(t, "the window closed", func() bool { return tn.engine.mono() >= tn.engine.vouchedUntil.Load() })
	if r := tn.deduct("gone", "c", "r-c", 1, false); r.Status != StatusUnavailable {
		t.Fatalf("cut off, window closed: %s %s, want unavailable", r.Status, r.Detail)
	}
	req := DeductRequest{SKU: []byte("gone"), User: []byte("d"), RequestID: []byte("r-d"), Qty: 1}
	var res DeductResult
	got := make(chan DeductResult, 1)
	if tn.engine.DeductAsync(&req, &res, func(r *DeductResult) { got <- *r }) {
		t.Fatalf("the event loop's deduct answered at once (%s), want it run on a goroutine while a round runs", res.Status)
	}
	select {
	case r := <-got:
		if r.Status != StatusUnavailable {
			t.Fatalf("event loop's deduct, cut off: %s, want unavailable", r.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the event loop's deduct was never answered")
	}
	// The leader reached again: sold_out again.
	cluster.cut.Store(false)
	if r := tn.deduct("gone", "e", "r-e", 1, false); r.Status != StatusSoldOut {
		t.Fatalf("after the cut: %s %s", r.Status, r.Detail)
	}
	tn.checkLedger("gone")
}

// TestVouch_ReadsReflectWhatTheNodeAnswered: ReadFresh waits until the
// ledger holds the highest index this node answered a write at, and says
// unavailable when it cannot in time.
func TestVouch_ReadsReflectWhatTheNodeAnswered(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), nil)
	if _, err := tn.engine.CreateSale("s", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	if err := tn.engine.ReadFresh(context.Background(), false); err != nil {
		t.Fatalf("after the node's own applied write: %v", err)
	}
	tn.engine.noteAnswered(tn.ledger.AppliedIndex() + 1000) // an answer its ledger lacks
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tn.engine.ReadFresh(ctx, false); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read while the ledger lacks an answered write: %v, want unavailable", err)
	}
	tn.checkLedger("s")
}
