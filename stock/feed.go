package stock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// FeedEventType says what happened to an order.
type FeedEventType uint8

// Feed event types. Values are part of the ledger's format.
const (
	FeedOrderCreated   FeedEventType = iota + 1 // a take committed: the order is held or sold
	FeedOrderConfirmed                          // a held order became sold
	FeedOrderReleased                           // a held order was cancelled or expired, or a take was turned down
)

var feedEventNames = [...]string{
	FeedOrderCreated: "order_created", FeedOrderConfirmed: "order_confirmed", FeedOrderReleased: "order_released",
}

func (t FeedEventType) String() string {
	if int(t) < len(feedEventNames) && feedEventNames[t] != "" {
		return feedEventNames[t]
	}
	return fmt.Sprintf("event(%d)", uint8(t))
}

// FeedEvent is one event of the order feed: the order as it stood right
// after the command, at the command's time.
type FeedEvent struct {
	Seq   uint64 // the event's place in the feed, from 1
	Index uint64 // the log index of the command
	Type  FeedEventType
	At    int64 // the command's time, unix nanos
	Order Order
}

// Cursor is the event's own cursor: reading after it returns the events
// that follow it.
func (e *FeedEvent) Cursor() Cursor { return Cursor{Index: e.Index, Seq: e.Seq} }

// ErrCursorExpired marks a cursor older than the feed's retention: events
// after it were pruned.
var ErrCursorExpired = errors.New("cursor older than the feed's retention")

// Consumer is a named reader of the feed and the cursor it acknowledged:
// the feed keeps every event after the slowest consumer's cursor (up to
// its size cap).
type Consumer struct {
	Name          string
	Cursor        Cursor
	AckedUnixNano int64 // the time of the command that set the cursor
}

// FeedPage is one read of the order feed.
type FeedPage struct {
	Events []FeedEvent
	// Head is the newest event this node has applied (zero: none yet).
	Head Cursor
	// Behind: the cursor read after lies beyond this node's applied log.
	// The node is catching up; the same read succeeds once it has.
	Behind bool
}

// FeedStats is the feed's state on this node.
type FeedStats struct {
	Head      Cursor
	HeadAt    int64  // the newest event's time, unix nanos (0: none)
	Floor     Cursor // events up to this cursor are pruned
	Retained  uint64 // events kept: Head.Seq - Floor.Seq
	Consumers []Consumer
}

// OrdersSnapshot is where a reconciliation read of a sale's orders
// stands: the orders as of log index Applied, which are the effects of
// the feed's events up to FeedCursor. A consumer that reconciles from it
// goes on reading the feed after FeedCursor.
type OrdersSnapshot struct {
	Applied    uint64
	FeedCursor Cursor
}

// Cursor names a place in the feed: the event with sequence Seq, applied
// at log index Index. The zero cursor is the feed's start.
type Cursor struct {
	Index uint64
	Seq   uint64
}

// String is the cursor's wire form, "<log index>-<sequence>"; the zero
// cursor is "0".
func (c Cursor) String() string {
	if c == (Cursor{}) {
		return "0"
	}
	return strconv.FormatUint(c.Index, 10) + "-" + strconv.FormatUint(c.Seq, 10)
}

// ErrBadCursor marks a cursor that is not of the wire form, or that names
// no event this feed ever had.
var ErrBadCursor = errors.New("bad cursor")

// ParseCursor reads a cursor's wire form; "" and "0" are the start.
func ParseCursor(s string) (Cursor, error) {
	if s == "" || s == "0" {
		return Cursor{}, nil
	}
	i, q, ok := strings.Cut(s, "-")
	if !ok {
		return Cursor{}, fmt.Errorf("%w %q: want <log index>-<sequence>", ErrBadCursor, s)
	}
	index, err1 := strconv.ParseUint(i, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	if err1 != nil || err2 != nil || seq == 0 || index == 0 {
		return Cursor{}, fmt.Errorf("%w %q: want <log index>-<sequence>, both positive", ErrBadCursor, s)
	}
	return Cursor{Index: index, Seq: seq}, nil
}
