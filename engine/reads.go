package engine

import (
	"context"
	"fmt"

	"stockd.dev/stockd/raftfsm/orderid"
	"stockd.dev/stockd/stock"
)

// SKUView is a sale as GET /v1/skus/{sku} shows it.
type SKUView struct {
	Row   stock.SKU
	State string // upcoming, open, sold_out
	// Applied is the ledger's applied index when the row was read: the
	// row holds every entry up to it.
	Applied uint64
}

// Sale states.
const (
	StateUpcoming = "upcoming"
	StateOpen     = "open"
	StateSoldOut  = "sold_out"
	StateClosed   = "closed"
)

// SKU reads a sale from the local ledger.
func (e *Engine) SKU(sku string) (SKUView, bool) {
	applied := e.ledger.AppliedIndex()
	row, _, ok := e.ledger.SKU(sku)
	if !ok {
		return SKUView{}, false
	}
	v := SKUView{Row: row, State: StateOpen, Applied: applied}
	switch {
	case row.Closed():
		v.State = StateClosed
	case row.Remaining() <= 0:
		v.State = StateSoldOut
	case row.Config.StartAtUnixNano > e.cfg.Now().UnixNano():
		v.State = StateUpcoming
	}
	return v, true
}

// SKUViews reads every sale from the local ledger, sorted by SKU.
func (e *Engine) SKUViews() []SKUView {
	rows, _ := e.ledger.SKUs()
	out := make([]SKUView, 0, len(rows))
	for _, row := range rows {
		v, ok := e.SKU(row.SKU)
		if ok {
			out = append(out, v)
		}
	}
	return out
}

// Order reads an order: from the ledger once committed, else from this
// node's pending takes (state pending), else from the pending orders the
// ledger turned down (state released, reason turned_down_<why>).
func (e *Engine) Order(id string) (stock.Order, bool, error) {
	o, ok, err := e.ledger.Order(id)
	if err == nil && ok && o.State == stock.OrderHeld {
		// It may have been confirmed or cancelled through another node:
		// held is said only when this node can vouch for it (vouch.go).
		caughtUp, verr := e.vouch()
		if verr != nil {
			return o, false, fmt.Errorf("cannot confirm that order %s is still held: %w", id, verr)
		}
		if caughtUp {
			return e.ledger.Order(id)
		}
	}
	if err != nil || ok {
		return o, ok, err
	}
	if p, ok := e.pendingOrd.get(id); ok {
		if r, done := p.outcome(); done && r.Status.Won() {
			return r.Order, true, nil
		}
		return p.pendingOrder(), true, nil
	}
	if o, ok := e.turnedDown.get(id); ok {
		if o.ID != id {
			// A repeat of a request id won elsewhere: the real order.
			return e.ledger.Order(o.ID)
		}
		return o, true, nil
	}
	return stock.Order{}, false, nil
}

// OrderOwner is the node that minted order id ("" for an id of another
// shape): where a pending order can be read before it commits.
func (e *Engine) OrderOwner(id string) string { return orderid.Owner(id) }

// Audit recounts a sale in the local ledger and checks this node's local
// law: units in its buckets plus its takes in flight equal leased[me].
func (e *Engine) Audit(sku string) (stock.Audit, LocalAudit, bool, error) {
	a, ok, err := e.ledger.AuditSKU(sku)
	if err != nil || !ok {
		return a, LocalAudit{}, ok, err
	}
	var local LocalAudit
	if s := e.lookupSale([]byte(sku)); s != nil {
		local = LocalAudit{
			Buckets:       s.buckets.Units(),
			TakesInFlight: s.takesInFlight.Load(),
			Leased:        a.Row.Leased[e.cfg.NodeID],
		}
		local.OK = local.Buckets+local.TakesInFlight == local.Leased
	}
	return a, local, true, nil
}

// LocalAudit is the node-local law at the moment of the audit. Under load it
// can be off by the units of a lease or take being applied right then.
type LocalAudit struct {
	OK            bool  `json:"ok"`
	Buckets       int64 `json:"buckets"`
	TakesInFlight int64 `json:"takes_in_flight"`
	Leased        int64 `json:"leased"`
}

// ParseCursor reads a feed cursor's wire form ("" and "0": the start).
func ParseCursor(s string) (stock.Cursor, error) {
	c, err := stock.ParseCursor(s)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrBadCursor, err)
	}
	return c, nil
}

// NodeAddrs returns the HTTP addresses nodes registered in the ledger.
func (e *Engine) NodeAddrs() map[string]string { return e.ledger.NodeAddrs() }

// AppliedIndex is the last log index this node's ledger holds.
func (e *Engine) AppliedIndex() uint64 { return e.ledger.AppliedIndex() }

// WaitApplied blocks until this node's ledger holds log index or ctx ends.
func (e *Engine) WaitApplied(ctx context.Context, index uint64) error {
	return e.ledger.WaitApplied(ctx, index)
}

// CommitBlocked reports whether the breaker refuses wait=commit deducts.
func (e *Engine) CommitBlocked() bool { return e.commitBlocked.Load() }

// LeaderReachable reports whether this node is in contact with a raft
// leader: its reads are then current, not stale. Without a cluster (tests)
// it is always true.
func (e *Engine) LeaderReachable() bool {
	return e.cfg.Cluster == nil || e.cfg.Cluster.CommitHealthy()
}
