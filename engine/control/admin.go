package control

import (
	crand "crypto/rand"
	"fmt"
	"math"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/waitroom"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// SaleSpec is what CreateSale needs; zero values mean "none".
type SaleSpec struct {
	Total   int64
	StartAt time.Time
	PerUser int64
	HoldTTL time.Duration
	// Lottery makes the sale a lottery whose entries close at
	// EntriesCloseAt (docs/feed-and-lottery.md).
	Lottery        bool
	EntriesCloseAt time.Time
	// Queue puts the sale behind a waiting room: OveradmitMilli is its
	// queue_overadmit in thousandths, AdmitTTL how long a token is valid
	// (zero: the defaults).
	Queue          bool
	OveradmitMilli int64
	AdmitTTL       time.Duration
}

// StoredTimeMin and StoredTimeMax bound the times the ledger stores
// exactly: int64 nanoseconds since 1970 reach from 1677-09-21 to
// 2262-04-11. A time outside wraps around when stored, so CreateSale
// refuses it.
var (
	StoredTimeMin = time.Unix(0, math.MinInt64).UTC()
	StoredTimeMax = time.Unix(0, math.MaxInt64).UTC()
)

// CreateSale creates a sale. It reports created=false when a sale with the
// same config already exists, and ErrConflict when one with another exists.
func (p *Plane) CreateSale(sku string, spec SaleSpec) (created bool, err error) {
	if sku == "" || spec.Total < 0 || spec.PerUser < 0 || spec.HoldTTL < 0 {
		return false, fmt.Errorf("%w: sale %q needs total, per_user and hold_ttl >= 0", engine.ErrInvalid, sku)
	}
	_, _, exists := p.ledger.SKU(sku)
	if !exists && p.Engine.Sales() >= engine.MaxSKUs {
		return false, fmt.Errorf("%w: this node holds %d", engine.ErrTooManySKUs, engine.MaxSKUs)
	}
	for _, t := range []struct {
		field string
		at    time.Time
	}{{"start_at", spec.StartAt}, {"entries_close_at", spec.EntriesCloseAt}} {
		if !t.at.IsZero() && (t.at.Before(StoredTimeMin) || t.at.After(StoredTimeMax)) {
			return false, fmt.Errorf("%w: %s %s is outside the times the ledger stores exactly (%s to %s)", engine.ErrInvalid, t.field,
				t.at.Format(time.RFC3339Nano), StoredTimeMin.Format(time.RFC3339Nano), StoredTimeMax.Format(time.RFC3339Nano))
		}
	}
	cfg := stock.SaleConfig{Total: spec.Total, PerUser: spec.PerUser, HoldTTLNanos: int64(spec.HoldTTL)}
	if !spec.StartAt.IsZero() {
		cfg.StartAtUnixNano = spec.StartAt.UnixNano()
	}
	cmd := &command.CreateSale{SKU: sku, Sale: cfg}
	if spec.Lottery {
		switch {
		case spec.EntriesCloseAt.IsZero() || !spec.EntriesCloseAt.After(spec.StartAt):
			return false, fmt.Errorf("%w: a lottery needs entries_close_at, after start_at", engine.ErrInvalid)
		case !exists && !spec.EntriesCloseAt.After(p.cfg.Now()):
			// A lottery closed before it is created would go straight to
			// its draw with nobody in it. (The same call for a lottery
			// that exists stays the idempotent repeat it is.)
			return false, fmt.Errorf("%w: entries_close_at %s is already past", engine.ErrInvalid, spec.EntriesCloseAt.UTC().Format(time.RFC3339Nano))
		case spec.PerUser != 0:
			return false, fmt.Errorf("%w: a lottery takes one entry per user; per_user does not apply", engine.ErrInvalid)
		}
		cmd.Sale.Mode, cmd.Sale.EntriesCloseAtUnixNano = stock.SaleModeLottery, spec.EntriesCloseAt.UnixNano()
		// The seed and the order-id key: secret until the draw (the
		// seed) or for ever (the key). A repeat of this call proposes
		// another secret, which the ledger ignores for an existing sale.
		cmd.Secret = make([]byte, lottery.SecretBytes)
		if _, err := crand.Read(cmd.Secret); err != nil {
			return false, fmt.Errorf("draw a lottery seed: %w", err)
		}
	}
	if spec.Queue {
		// The seed of the order at the open (its hash is shown, the seed
		// revealed at the open) and the first signing key of its tokens.
		cmd.Sale.Admission, cmd.Sale.QueueOveradmitMilli, cmd.Sale.QueueAdmitTTLNanos = stock.AdmissionQueue, spec.OveradmitMilli, int64(spec.AdmitTTL)
		cmd.Secret = make([]byte, waitroom.SecretBytes)
		if _, err := crand.Read(cmd.Secret); err != nil {
			return false, fmt.Errorf("draw a waiting room's seed: %w", err)
		}
		if d := waitroom.CheckConfig(&cmd.Sale, cmd.Secret); d != "" {
			return false, fmt.Errorf("%w: %s", engine.ErrInvalid, d)
		}
	}
	res, err := p.Engine.Propose(cmd)
	if err != nil {
		return false, err
	}
	switch res.Outcome {
	case stock.OutcomeOK:
		return true, nil
	case stock.OutcomeSame:
		return false, nil
	case stock.OutcomeConflict:
		return false, fmt.Errorf("%w: sku %q", engine.ErrConflict, sku)
	}
	return false, fmt.Errorf("%w: the ledger refused the sale (%s): %s", engine.ErrInvalid, res.Outcome, res.Detail)
}

// Restock adds qty units to a sale.
func (p *Plane) Restock(sku string, qty int64) error {
	if qty <= 0 {
		return fmt.Errorf("%w: restock qty %d <= 0", engine.ErrInvalid, qty)
	}
	res, err := p.Engine.Propose(&command.Restock{SKU: sku, Qty: qty})
	if err != nil {
		return err
	}
	if res.Outcome == stock.OutcomeOK {
		p.Engine.HoldAck() // no node may answer sold_out once this is answered
	}
	return saleOutcome(sku, res)
}

// CloseSale stops a sale: new deducts get closed, every node's lease goes
// back to available; held orders may still be confirmed until they
// expire.
func (p *Plane) CloseSale(sku string) error {
	res, err := p.Engine.Propose(&command.CloseSale{SKU: sku})
	if err != nil {
		return err
	}
	return saleOutcome(sku, res)
}

// ArchiveSale takes a closed sale's orders out of the ledger (its totals
// stay): the leader then removes them in bounded steps, and every node
// compacts its ledger file once they are gone.
func (p *Plane) ArchiveSale(sku string) error {
	res, err := p.Engine.Propose(&command.ArchiveSale{SKU: sku})
	if err != nil {
		return err
	}
	if err := saleOutcome(sku, res); err != nil {
		return err
	}
	p.wakePurge()
	return nil
}

// saleOutcome is the error a sale-level command's outcome means (nil for
// done, or done before).
func saleOutcome(sku string, res *command.Result) error {
	switch res.Outcome {
	case stock.OutcomeOK, stock.OutcomeSame:
		return nil
	case stock.OutcomeUnknownSKU:
		return fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case stock.OutcomeClosed:
		return fmt.Errorf("%w: %q", engine.ErrSaleClosed, sku)
	case stock.OutcomeNotClosed:
		return fmt.Errorf("%w: %s", engine.ErrNotClosed, res.Detail)
	case stock.OutcomeHoldsPending:
		return fmt.Errorf("%w: %s", engine.ErrHoldsPending, res.Detail)
	case stock.OutcomeUnconsumed:
		return fmt.Errorf("%w: %s", engine.ErrUnconsumed, res.Detail)
	case stock.OutcomeLottery:
		return fmt.Errorf("%w: %s", ErrEntriesClosed, res.Detail)
	}
	return fmt.Errorf("%w: %s %s", engine.ErrInvalid, res.Outcome, res.Detail)
}

// Confirm turns a held order sold.
func (p *Plane) Confirm(id string) (stock.Order, error) {
	return p.orderCommand(&command.Confirm{OrderID: id})
}

// Cancel releases a held order; its units return to available.
func (p *Plane) Cancel(id string) (stock.Order, error) {
	return p.orderCommand(&command.Release{OrderID: id, Reason: stock.ReleaseCancelled})
}

func (p *Plane) orderCommand(c command.Command) (stock.Order, error) {
	res, err := p.Engine.Propose(c)
	if err != nil {
		return stock.Order{}, err
	}
	var o stock.Order
	if res.Order != nil {
		o = *res.Order
	}
	if res.Outcome == stock.OutcomeOK || res.Outcome == stock.OutcomeSame {
		// No node may answer the order held, or its units sold out or
		// past the buyer's limit, once this is answered (vouch.go). A
		// repeat waits too: its first call may still be in its hold.
		p.Engine.HoldAck()
	}
	switch res.Outcome {
	case stock.OutcomeOK, stock.OutcomeSame:
		return o, nil
	case stock.OutcomeNotFound:
		return o, fmt.Errorf("%w: no order %q", engine.ErrNotFound, orderOf(c))
	case stock.OutcomeExpired:
		return o, engine.ErrExpired
	case stock.OutcomeInvalidState:
		return o, engine.ErrInvalidState
	}
	return o, fmt.Errorf("%w: %s %s", engine.ErrInvalid, res.Outcome, res.Detail)
}

// orderOf is the order a confirm or a release names.
func orderOf(c command.Command) string {
	switch c := c.(type) {
	case *command.Confirm:
		return c.OrderID
	case *command.Release:
		return c.OrderID
	}
	return ""
}

// Reclaim returns all of node's leases to available (after it left the
// cluster) and reports the units.
func (p *Plane) Reclaim(node string) (int64, error) {
	res, err := p.Engine.Propose(&command.Reclaim{Node: node})
	if err != nil {
		return 0, err
	}
	return res.Qty, nil
}
