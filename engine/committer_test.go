package engine

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"stockd/raftfsm"
	"stockd/raftfsm/command"
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

func (p *refusingProposer) Propose(at int64, c command.Command) (*raftfsm.Result, error) {
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
