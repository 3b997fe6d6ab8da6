package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// catchUpWait bounds how long a miss waits to catch up with the leader
// before it answers unavailable instead.
const catchUpWait = time.Second

// A node's ledger trails the leader's by a few milliseconds, and a sale or
// an order made through another node can be one this node has not applied
// yet. Its own ledger is enough to say what exists; "no such sale" and "no
// such order" need more, since clients take them as final. Before giving
// one, the node catches up: it asks the cluster for a read index (an index
// every acknowledged write has reached) and waits until its ledger has
// applied it.
//
// Misses share rounds: one round at a time asks the leader, and every miss
// that arrives meanwhile waits for the next, which starts after it
// arrived, so that its index covers what was acknowledged before that
// miss. A flood of unknown SKUs costs the leader one read index per round
// trip per node, not one per request.
type catchUps struct {
	mu   sync.Mutex
	next *catchUpRound // the round misses arriving now wait for
	// running is written under mu and read without it too (a follower's
	// sold-out answers, which start the next round near the end of their
	// window, take no lock while one runs).
	running atomic.Bool
}

type catchUpRound struct {
	done chan struct{}
	err  error
	// lease: the leader may vouch on its lease (LeaseReadIndex) rather
	// than a quorum round. Only vouch.go asks for it; a round that any
	// other caller joins (a 404's catch-up, a linearizable read) is a
	// quorum round.
	lease bool
}

// catchUp returns once this node's ledger holds every write the cluster
// acknowledged before the call, or an error (no leader, no quorum, the
// wait ran out). A node without a cluster is always caught up.
func (e *Engine) catchUp(ctx context.Context) error {
	return e.catchUpWith(ctx, false)
}

// catchUpWith is catchUp; with lease the round may rest on the leader's
// lease (a vouch; catchUpRound.lease).
func (e *Engine) catchUpWith(ctx context.Context, lease bool) error {
	if e.cfg.Cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	c := &e.catchUps
	c.mu.Lock()
	r := e.joinRoundLocked(lease)
	c.mu.Unlock()
	e.metrics.catchUps.Add(1)
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("catch up with the leader: %w", ctx.Err())
	case <-e.stop:
		return fmt.Errorf("%w: node is shutting down", ErrUnavailable)
	}
}

// joinRoundLocked returns the round a caller arriving now waits for (one
// that starts after it arrived), starting it unless a round runs: the
// running one then starts it when it ends. c.mu is held.
func (e *Engine) joinRoundLocked(lease bool) *catchUpRound {
	c := &e.catchUps
	if c.next == nil {
		c.next = &catchUpRound{done: make(chan struct{}), lease: lease}
	}
	r := c.next
	r.lease = r.lease && lease // one caller that needs the quorum round gets it
	if !c.running.Load() {
		c.running.Store(true)
		c.next = nil
		go e.runCatchUps(r)
	}
	return r
}

// runCatchUps runs round r, then the rounds misses queued meanwhile, until
// none is queued.
func (e *Engine) runCatchUps(r *catchUpRound) {
	c := &e.catchUps
	for {
		r.err = e.catchUpOnce(r.lease)
		close(r.done)
		c.mu.Lock()
		r = c.next
		c.next = nil
		if r == nil {
			c.running.Store(false)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

func (e *Engine) catchUpOnce(lease bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), catchUpWait)
	defer cancel()
	e.metrics.catchUpRounds.Add(1)
	started := e.mono()
	readIndex := e.cfg.Cluster.ReadIndex
	if lease {
		readIndex = e.cfg.Cluster.LeaseReadIndex
	}
	index, err := readIndex(ctx)
	if err != nil {
		return fmt.Errorf("%w: cannot confirm with the leader: %v", ErrUnavailable, err)
	}
	if err := e.ledger.WaitApplied(ctx, index); err != nil {
		return fmt.Errorf("%w: this node has not applied log index %d yet: %v", ErrUnavailable, index, err)
	}
	e.vouchedFrom(started)
	return nil
}

// batchCatchUp lets the deducts of one batch share a catch-up: one done
// after the batch arrived covers every miss in it.
type batchCatchUp struct {
	done bool
	err  error
}

// saleAfterCatchUp is admit's way for a SKU this node has no sale for: the
// sale may be in the ledger already (its event not yet handled), or only
// on the leader's. It returns the sale, or nil with res set to
// unknown_sku, or unavailable when the node could not catch up.
func (e *Engine) saleAfterCatchUp(req *DeductRequest, res *DeductResult) *sale {
	sku := string(req.SKU)
	row, _, ok := e.ledger.SKU(sku)
	if !ok {
		var err error
		switch b := req.catchUp; {
		case b == nil:
			err = e.catchUp(context.Background())
		case b.done:
			err = b.err
		default:
			b.err, b.done = e.catchUp(context.Background()), true
			err = b.err
		}
		if err != nil {
			res.Status, res.Detail = StatusUnavailable, "cannot tell whether this sale exists: "+err.Error()
			return nil
		}
		if row, _, ok = e.ledger.SKU(sku); !ok {
			res.Status = StatusUnknownSKU
			return nil
		}
	}
	s, _ := e.saleFor(&row)
	return s
}

// CatchUp returns once this node's ledger holds every write the cluster
// acknowledged before the call (or an ErrUnavailable): a read that finds
// nothing calls it before it answers "not found".
func (e *Engine) CatchUp(ctx context.Context) error { return e.catchUp(ctx) }
