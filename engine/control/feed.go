package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// The order feed (docs/feed-and-lottery.md): reads with long-polling,
// named consumers and their acknowledged cursors, and the leader's
// retention.

// FeedLimitMax bounds the events one read returns.
const FeedLimitMax = 1000

// FeedWaitMax bounds a read's long-poll.
const FeedWaitMax = 30 * time.Second

// Events returns up to limit events after cursor after. When there are
// none yet it waits up to wait for some (or for this node to catch up
// with a cursor from a node ahead of it).
func (p *Plane) Events(ctx context.Context, after stock.Cursor, limit int, wait time.Duration) (stock.FeedPage, error) {
	if !p.ledger.FeedOn() {
		return stock.FeedPage{}, fmt.Errorf("%w: this node runs with -no-order-feed", engine.ErrUnavailable)
	}
	limit = min(max(limit, 1), FeedLimitMax)
	wait = min(max(wait, 0), FeedWaitMax)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		changed := p.ledger.FeedChanged()
		page, err := p.ledger.ReadFeed(after, limit)
		switch {
		case errors.Is(err, stock.ErrCursorExpired):
			return page, fmt.Errorf("%w: %w", engine.ErrCursorExpired, err)
		case errors.Is(err, stock.ErrBadCursor):
			return page, fmt.Errorf("%w: %w", engine.ErrBadCursor, err)
		case err != nil:
			return page, fmt.Errorf("%w: read the order feed: %w", engine.ErrUnavailable, err)
		case len(page.Events) > 0:
			return page, nil
		}
		if page.Behind {
			if p.ledger.WaitApplied(ctx, after.Index) != nil {
				return page, nil // still behind: the page says so
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return page, nil
		case <-p.stopped.Done():
			return page, nil
		}
	}
}

// ConsumerView is one consumer of the feed and how far behind it is.
type ConsumerView struct {
	Name       string
	Cursor     stock.Cursor
	AckedAt    time.Time
	LagEvents  uint64
	LagSeconds float64 // the age of its oldest unacknowledged event
}

// FeedView is the feed's state on this node, with its consumers' lag.
type FeedView struct {
	Head      stock.Cursor
	HeadAt    time.Time
	Floor     stock.Cursor
	Retained  uint64
	Cap       uint64
	Retention time.Duration
	Consumers []ConsumerView
}

// Feed reads the feed's state and each consumer's lag.
func (p *Plane) Feed() (FeedView, error) {
	st, err := p.ledger.FeedStats()
	if err != nil {
		return FeedView{}, fmt.Errorf("%w: read the order feed: %w", engine.ErrUnavailable, err)
	}
	v := FeedView{Head: st.Head, Floor: st.Floor, Retained: st.Retained, Cap: p.cfg.FeedCap, Retention: p.cfg.FeedRetention}
	if st.HeadAt != 0 {
		v.HeadAt = time.Unix(0, st.HeadAt)
	}
	now := p.cfg.Now()
	for _, c := range st.Consumers {
		cv := ConsumerView{Name: c.Name, Cursor: c.Cursor, AckedAt: time.Unix(0, c.AckedUnixNano)}
		if st.Head.Seq > c.Cursor.Seq {
			cv.LagEvents = st.Head.Seq - c.Cursor.Seq
			if next, ok, err := p.ledger.FeedEvent(max(c.Cursor.Seq, st.Floor.Seq) + 1); err == nil && ok {
				cv.LagSeconds = max(now.Sub(time.Unix(0, next.At)).Seconds(), 0)
			}
		}
		v.Consumers = append(v.Consumers, cv)
	}
	return v, nil
}

// AckConsumer records consumer name's acknowledged cursor (registering
// it): the feed keeps every event after it, up to its cap.
func (p *Plane) AckConsumer(name string, c stock.Cursor) error {
	return p.consumerCommand(&command.AckConsumer{Name: name, Cursor: c})
}

// AdvanceConsumer moves registered consumer name's cursor forward to c (a
// cursor at or before its own changes nothing; moved says whether it
// moved). What a service credential may do.
func (p *Plane) AdvanceConsumer(name string, c stock.Cursor) (moved bool, err error) {
	if p.ledger.Rules() < raftfsm.RulesForwardAcks {
		return false, fmt.Errorf("%w: acknowledging with the service credential needs ledger rules %d (every node on this version); use the admin token", engine.ErrForbidden, raftfsm.RulesForwardAcks)
	}
	err = p.consumerCommand(&command.AckConsumer{Name: name, Cursor: c, Forward: true})
	if errors.Is(err, errSame) {
		return false, nil
	}
	return err == nil, err
}

// errSame: the command changed nothing.
var errSame = errors.New("unchanged")

// DropConsumer removes a consumer: it no longer holds retention.
func (p *Plane) DropConsumer(name string) error {
	return p.consumerCommand(&command.AckConsumer{Name: name, Drop: true})
}

func (p *Plane) consumerCommand(c *command.AckConsumer) error {
	res, err := p.Engine.Propose(c)
	if err != nil {
		return err
	}
	switch res.Outcome {
	case stock.OutcomeOK:
		return nil
	case stock.OutcomeSame:
		return errSame
	case stock.OutcomeNotFound:
		return fmt.Errorf("%w: no consumer %q", engine.ErrNotFound, c.Name)
	case stock.OutcomeExpired:
		return fmt.Errorf("%w: %s", engine.ErrCursorExpired, res.Detail)
	}
	return fmt.Errorf("%w: %s", engine.ErrInvalid, res.Detail)
}

// pruneFeed is the leader's retention: it prunes the events older than
// FeedRetention that every consumer has acknowledged, and the oldest
// beyond FeedCap whatever the consumers (with a warning when a consumer
// had not read them).
func (p *Plane) pruneFeed(now time.Time) {
	if !p.Engine.IsLeader() || p.Engine.CommitBlocked() {
		return
	}
	st, err := p.ledger.FeedStats()
	if err != nil || st.Retained == 0 {
		return
	}
	through, _, err := p.ledger.FeedCursorBefore(now.Add(-p.cfg.FeedRetention).UnixNano())
	if err != nil {
		return
	}
	var slowest *stock.Consumer
	for i := range st.Consumers {
		if c := &st.Consumers[i]; slowest == nil || c.Cursor.Seq < slowest.Cursor.Seq {
			slowest = c
		}
	}
	if slowest != nil && slowest.Cursor.Seq < through.Seq {
		through = slowest.Cursor // a consumer still needs the events after it
	}
	capped := false
	if st.Retained > p.cfg.FeedCap {
		capSeq := st.Head.Seq - p.cfg.FeedCap
		if through.Seq < capSeq {
			ev, ok, err := p.ledger.FeedEvent(capSeq)
			if err != nil || !ok {
				return
			}
			through, capped = ev.Cursor(), true
		}
	}
	if through.Seq <= st.Floor.Seq {
		p.Engine.Metrics().NoteFeedPrune(false, 0)
		return
	}
	res, err := p.Engine.Propose(&command.PruneEvents{Through: through})
	if err != nil || res.Outcome != stock.OutcomeOK {
		p.logger.Debug("prune the order feed", "through", through.String(), "err", err)
		return
	}
	unread := uint64(0)
	if capped && slowest != nil && slowest.Cursor.Seq < through.Seq {
		unread = through.Seq - max(slowest.Cursor.Seq, st.Floor.Seq)
	}
	p.Engine.Metrics().NoteFeedPrune(unread > 0, unread)
	if unread > 0 {
		p.logger.Warn("order feed at its cap: pruned events a consumer has not acknowledged",
			"consumer", slowest.Name, "consumer_cursor", slowest.Cursor.String(), "pruned_through", through.String(),
			"unacknowledged_events_pruned", unread, "cap", p.cfg.FeedCap)
	}
	p.logger.Debug("pruned the order feed", "through", through.String(), "events", res.Qty)
}

// SaleOrders calls fn for every order of sku (in state, if set) whose id
// sorts after after, in order id order, from one consistent state of this
// node's ledger; it says which log index and feed cursor that state
// reflects. For reconciliation: it scans every order of the ledger.
func (p *Plane) SaleOrders(sku string, state string, after string, fn func(*stock.Order) error) (stock.OrdersSnapshot, error) {
	switch stock.OrderState(state) {
	case "", stock.OrderHeld, stock.OrderSold, stock.OrderReleased:
	default:
		return stock.OrdersSnapshot{}, fmt.Errorf("%w: state %q is not held, sold or released", engine.ErrInvalid, state)
	}
	if _, _, ok := p.ledger.SKU(sku); !ok {
		return stock.OrdersSnapshot{}, fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	}
	snap, err := p.ledger.SaleOrders(sku, stock.OrderState(state), after, fn)
	if err != nil && !errors.Is(err, ErrStreamStopped) {
		return snap, fmt.Errorf("%w: read the orders of %q: %w", engine.ErrUnavailable, sku, err)
	}
	return snap, err
}

// ErrStreamStopped is what a SaleOrders callback returns to stop early.
var ErrStreamStopped = errors.New("stream stopped")
