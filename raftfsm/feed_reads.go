package raftfsm

import "stockd.dev/stockd/stock"

// ReadFeed returns up to limit events after cursor after, in order.
// Errors: ErrCursorExpired for a cursor older than retention (or from
// before a restore's gap), ErrBadCursor for one that names no event of the
// feed.
func (l *Ledger) ReadFeed(after stock.Cursor, limit int) (stock.FeedPage, error) {
	if err := l.checkRestoreGap(after); err != nil {
		return stock.FeedPage{}, err
	}
	return l.feed.Read(after, limit, l.AppliedIndex())
}

// FeedChanged returns a channel closed when new events are published (or
// the ledger is replaced or closed): long-polling readers wait on it.
func (l *Ledger) FeedChanged() <-chan struct{} { return l.feed.Changed() }

// FeedStats reads the feed's head, floor and consumers.
func (l *Ledger) FeedStats() (stock.FeedStats, error) { return l.feed.Stats() }

// FeedCursorBefore is the cursor of the newest event older than
// atUnixNano, and whether there is one after the floor: retention by time
// prunes up to it.
func (l *Ledger) FeedCursorBefore(atUnixNano int64) (stock.Cursor, bool, error) {
	return l.feed.CursorBefore(atUnixNano)
}

// FeedEvent reads event seq, if the feed still holds it.
func (l *Ledger) FeedEvent(seq uint64) (stock.FeedEvent, bool, error) { return l.feed.Event(seq) }
