package raftfsm

import (
	"fmt"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/orderfeed"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
)

// The applier's side of the order feed: a batch numbers its events after
// the feed's last one, and keeps its consumer and floor changes until the
// batch is published.

// maxConsumerNameBytes bounds a consumer's name.
const maxConsumerNameBytes = 128

// feedBatch is one batch's share of the feed.
type feedBatch struct {
	on        bool // the ledger records order events
	seq       uint64
	floorAt   stock.Cursor
	events    []stock.FeedEvent
	consumers map[string]*stock.Consumer // nil: dropped
	newFloor  bool
}

func (a *applier) startFeed() {
	seq, floorAt := a.ledger.feed.Last()
	a.feed = feedBatch{on: !a.ledger.feedOff.Load(), seq: seq, floorAt: floorAt}
}

// feedEvent records what just happened to o.
func (a *applier) feedEvent(t stock.FeedEventType, o *stock.Order) {
	if !a.feed.on {
		return
	}
	a.feed.seq++
	a.feed.events = append(a.feed.events, stock.FeedEvent{Seq: a.feed.seq, Index: a.index, Type: t, At: a.at, Order: *o})
	if s := a.sku(o.SKU); s != nil {
		s.LastEventSeq = a.feed.seq
	}
}

// turnedDown records a take entry the ledger refused: an order its node
// may have promised (wait=none) that never came to be.
func (a *applier) turnedDown(node string, e *command.TakeEntry, outcome stock.Outcome) {
	var reason string
	switch outcome {
	case stock.OutcomeUserLimit:
		reason = stock.ReleaseTurnedDownUserLimit
	case stock.OutcomeLeaseShort:
		reason = stock.ReleaseTurnedDownLeaseShort
	case stock.OutcomeUnknownSKU:
		reason = stock.ReleaseTurnedDownUnknownSKU
	case stock.OutcomeClosed:
		reason = stock.ReleaseTurnedDownClosed
	case stock.OutcomeRequestIDReused:
		reason = stock.ReleaseTurnedDownRequestIDReused
	default:
		return
	}
	a.feedEvent(stock.FeedOrderReleased, &stock.Order{ID: e.OrderID, SKU: e.SKU, User: e.User, Qty: e.Qty, RequestID: e.RequestID,
		Node: node, State: stock.OrderReleased, ReleaseReason: reason, CreatedAtUnixNano: a.at})
}

// feedEventIndex is the log index of event seq as this batch sees it.
func (a *applier) feedEventIndex(seq uint64) (uint64, bool, error) {
	if n := len(a.feed.events); n > 0 && seq >= a.feed.events[0].Seq {
		return a.feed.events[seq-a.feed.events[0].Seq].Index, true, nil
	}
	if e, ok := a.ledger.feed.MemEvent(seq); ok {
		return e.Index, true, nil
	}
	tx, err := a.readTx()
	if err != nil {
		return 0, false, err
	}
	ev, ok, err := orderfeed.ReadFeedEvent(tx.Bucket(store.BucketEvents), seq)
	if err != nil || !ok {
		return 0, false, err
	}
	return ev.Index, true, nil
}

// checkFeedCursor is nil when c names an event of the feed at or after
// its floor (or the start, or the floor itself), else a result saying why.
func (a *applier) checkFeedCursor(c stock.Cursor) (*command.Result, error) {
	switch {
	case c.Seq == 0 && c.Index == 0:
		return nil, nil
	case c.Seq == 0 || c.Index == 0:
		return invalid("cursor %s: both parts must be positive", c), nil
	case c.Seq > a.feed.seq:
		return invalid("cursor %s is beyond the feed's newest event", c), nil
	case c.Seq < a.feed.floorAt.Seq:
		return &command.Result{Outcome: stock.OutcomeExpired, Detail: fmt.Sprintf("cursor %s is older than the feed's retention (pruned up to %s)", c, a.feed.floorAt)}, nil
	case c.Seq == a.feed.floorAt.Seq:
		if c != a.feed.floorAt {
			return invalid("cursor %s names no event of the feed", c), nil
		}
		return nil, nil
	}
	index, ok, err := a.feedEventIndex(c.Seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		panic(fmt.Sprintf("BUG: feed event %d above the floor %d is missing", c.Seq, a.feed.floorAt.Seq))
	}
	if index != c.Index {
		return invalid("cursor %s names no event of the feed", c), nil
	}
	return nil, nil
}

func (a *applier) ackConsumer(c *command.AckConsumer) (*command.Result, error) {
	if c.Name == "" || len(c.Name) > maxConsumerNameBytes {
		return invalid("consumer name must be 1..%d bytes", maxConsumerNameBytes), nil
	}
	if c.Drop {
		if !a.hasConsumer(c.Name) {
			return &command.Result{Outcome: stock.OutcomeNotFound}, nil
		}
		a.put(store.BucketConsumers, []byte(c.Name), nil)
		a.stageConsumer(c.Name, nil)
		return &command.Result{Outcome: stock.OutcomeOK}, nil
	}
	if c.Forward {
		if a.rules < RulesForwardAcks {
			return invalid("a forward-only acknowledgement needs ledger rules %d", RulesForwardAcks), nil
		}
		have, ok := a.consumer(c.Name)
		switch {
		case !ok:
			return &command.Result{Outcome: stock.OutcomeNotFound}, nil
		case c.Cursor.Seq <= have.Cursor.Seq:
			return &command.Result{Outcome: stock.OutcomeSame}, nil
		}
	}
	if res, err := a.checkFeedCursor(c.Cursor); res != nil || err != nil {
		return res, err
	}
	cons := &stock.Consumer{Name: c.Name, Cursor: c.Cursor, AckedUnixNano: a.at}
	a.put(store.BucketConsumers, []byte(c.Name), orderfeed.EncodeConsumer(cons))
	a.stageConsumer(c.Name, cons)
	return &command.Result{Outcome: stock.OutcomeOK}, nil
}

func (a *applier) hasConsumer(name string) bool {
	_, ok := a.consumer(name)
	return ok
}

// consumer is consumer name as this batch sees it.
func (a *applier) consumer(name string) (stock.Consumer, bool) {
	if c, ok := a.feed.consumers[name]; ok {
		if c == nil {
			return stock.Consumer{}, false
		}
		return *c, true
	}
	return a.ledger.feed.Consumer(name)
}

func (a *applier) stageConsumer(name string, c *stock.Consumer) {
	if a.feed.consumers == nil {
		a.feed.consumers = map[string]*stock.Consumer{}
	}
	a.feed.consumers[name] = c
}

func (a *applier) pruneEvents(c *command.PruneEvents) (*command.Result, error) {
	if c.Through.Seq == 0 || c.Through.Index == 0 {
		return invalid("prune_events needs a cursor"), nil
	}
	if c.Through.Seq <= a.feed.floorAt.Seq {
		return &command.Result{Outcome: stock.OutcomeSame}, nil
	}
	if res, err := a.checkFeedCursor(c.Through); res != nil || err != nil {
		return res, err
	}
	pruned := c.Through.Seq - a.feed.floorAt.Seq
	a.feed.floorAt, a.feed.newFloor = c.Through, true
	a.put(store.BucketMeta, store.KeyFeedFloor, orderfeed.EncodeCursor(c.Through))
	return &command.Result{Outcome: stock.OutcomeOK, Qty: int64(pruned)}, nil
}

// publishFeed makes the batch's feed changes visible. The caller has
// already staged the events (before the persister could see the batch).
func (a *applier) publishFeed() {
	var floorAt *stock.Cursor
	if a.feed.newFloor {
		floorAt = &a.feed.floorAt
	}
	a.ledger.feed.Publish(a.feed.consumers, floorAt)
}
