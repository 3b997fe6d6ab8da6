package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stockd/raftfsm/command"
	"stockd/stock"
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
func (e *Engine) Events(ctx context.Context, after stock.Cursor, limit int, wait time.Duration) (stock.FeedPage, error) {
	if !e.ledger.FeedOn() {
		return stock.FeedPage{}, fmt.Errorf("%w: this node runs with -no-order-feed", ErrUnavailable)
	}
	limit = min(max(limit, 1), FeedLimitMax)
	wait = min(max(wait, 0), FeedWaitMax)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		changed := e.ledger.FeedChanged()
		page, err := e.ledger.ReadFeed(after, limit)
		switch {
		case errors.Is(err, stock.ErrCursorExpired):
			return page, fmt.Errorf("%w: %w", ErrCursorExpired, err)
		case errors.Is(err, stock.ErrBadCursor):
			return page, fmt.Errorf("%w: %w", ErrBadCursor, err)
		case err != nil:
			return page, fmt.Errorf("%w: read the order feed: %w", ErrUnavailable, err)
		case len(page.Events) > 0:
			return page, nil
		}
		if page.Behind {
			if e.ledger.WaitApplied(ctx, after.Index) != nil {
				return page, nil // still behind: the page says so
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return page, nil
		case <-e.stopped.Done():
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
func (e *Engine) Feed() (FeedView, error) {
	st, err := e.ledger.FeedStats()
	if err != nil {
		return FeedView{}, fmt.Errorf("%w: read the order feed: %w", ErrUnavailable, err)
	}
	v := FeedView{Head: st.Head, Floor: st.Floor, Retained: st.Retained, Cap: e.cfg.FeedCap, Retention: e.cfg.FeedRetention}
	if st.HeadAt != 0 {
		v.HeadAt = time.Unix(0, st.HeadAt)
	}
	now := e.cfg.Now()
	for _, c := range st.Consumers {
		cv := ConsumerView{Name: c.Name, Cursor: c.Cursor, AckedAt: time.Unix(0, c.AckedUnixNano)}
		if st.Head.Seq > c.Cursor.Seq {
			cv.LagEvents = st.Head.Seq - c.Cursor.Seq
			if next, ok, err := e.ledger.FeedEvent(max(c.Cursor.Seq, st.Floor.Seq) + 1); err == nil && ok {
				cv.LagSeconds = max(now.Sub(time.Unix(0, next.At)).Seconds(), 0)
			}
		}
		v.Consumers = append(v.Consumers, cv)
	}
	return v, nil
}

// AckConsumer records consumer name's acknowledged cursor (registering
// it): the feed keeps every event after it, up to its cap.
func (e *Engine) AckConsumer(name string, c stock.Cursor) error {
	return e.consumerCommand(&command.AckConsumer{Name: name, Cursor: c})
}

// DropConsumer removes a consumer: it no longer holds retention.
func (e *Engine) DropConsumer(name string) error {
	return e.consumerCommand(&command.AckConsumer{Name: name, Drop: true})
}

func (e *Engine) consumerCommand(c *command.AckConsumer) error {
	res, err := e.propose(c)
	if err != nil {
		return err
	}
	switch res.Outcome {
	case stock.OutcomeOK:
		return nil
	case stock.OutcomeNotFound:
		return fmt.Errorf("%w: no consumer %q", ErrNotFound, c.Name)
	case stock.OutcomeExpired:
		return fmt.Errorf("%w: %s", ErrCursorExpired, res.Detail)
	}
	return fmt.Errorf("%w: %s", ErrInvalid, res.Detail)
}

// pruneFeed is the leader's retention: it prunes the events older than
// FeedRetention that every consumer has acknowledged, and the oldest
// beyond FeedCap whatever the consumers (with a warning when a consumer
// had not read them).
func (e *Engine) pruneFeed(now time.Time) {
	if e.cfg.Cluster != nil && !e.cfg.Cluster.IsLeader() || e.commitBlocked.Load() {
		return
	}
	st, err := e.ledger.FeedStats()
	if err != nil || st.Retained == 0 {
		return
	}
	through, _, err := e.ledger.FeedCursorBefore(now.Add(-e.cfg.FeedRetention).UnixNano())
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
	if st.Retained > e.cfg.FeedCap {
		capSeq := st.Head.Seq - e.cfg.FeedCap
		if through.Seq < capSeq {
			ev, ok, err := e.ledger.FeedEvent(capSeq)
			if err != nil || !ok {
				return
			}
			through, capped = ev.Cursor(), true
		}
	}
	if through.Seq <= st.Floor.Seq {
		e.metrics.feedAtCap.Store(false)
		return
	}
	res, err := e.propose(&command.PruneEvents{Through: through})
	if err != nil || res.Outcome != stock.OutcomeOK {
		e.logger.Debug("prune the order feed", "through", through.String(), "err", err)
		return
	}
	unread := uint64(0)
	if capped && slowest != nil && slowest.Cursor.Seq < through.Seq {
		unread = through.Seq - max(slowest.Cursor.Seq, st.Floor.Seq)
	}
	e.metrics.feedAtCap.Store(unread > 0)
	if unread > 0 {
		e.metrics.feedUnreadPruned.Add(unread)
		e.logger.Warn("order feed at its cap: pruned events a consumer has not acknowledged",
			"consumer", slowest.Name, "consumer_cursor", slowest.Cursor.String(), "pruned_through", through.String(),
			"unacknowledged_events_pruned", unread, "cap", e.cfg.FeedCap)
	}
	e.logger.Debug("pruned the order feed", "through", through.String(), "events", res.Qty)
}

// SaleOrders calls fn for every order of sku (in state, if set) whose id
// sorts after after, in order id order, from one consistent state of this
// node's ledger; it says which log index and feed cursor that state
// reflects. For reconciliation: it scans every order of the ledger.
func (e *Engine) SaleOrders(sku string, state string, after string, fn func(*stock.Order) error) (stock.OrdersSnapshot, error) {
	switch stock.OrderState(state) {
	case "", stock.OrderHeld, stock.OrderSold, stock.OrderReleased:
	default:
		return stock.OrdersSnapshot{}, fmt.Errorf("%w: state %q is not held, sold or released", ErrInvalid, state)
	}
	if _, _, ok := e.ledger.SKU(sku); !ok {
		return stock.OrdersSnapshot{}, fmt.Errorf("%w: %q", ErrUnknownSKU, sku)
	}
	snap, err := e.ledger.SaleOrders(sku, stock.OrderState(state), after, fn)
	if err != nil && !errors.Is(err, ErrStreamStopped) {
		return snap, fmt.Errorf("%w: read the orders of %q: %w", ErrUnavailable, sku, err)
	}
	return snap, err
}

// ErrStreamStopped is what a SaleOrders callback returns to stop early.
var ErrStreamStopped = errors.New("stream stopped")
