package orderfeed

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// Event reads event seq from memory or, failing that, from bbolt; an
// event at or below the floor is pruned.
func (f *Feed) Event(seq uint64) (stock.FeedEvent, bool, error) {
	f.mu.RLock()
	e, ok := f.memEvent(seq)
	floor := f.floorAt.Seq
	f.mu.RUnlock()
	if ok {
		return e, true, nil
	}
	if seq <= floor {
		return stock.FeedEvent{}, false, nil // pruned (its chunk may remain)
	}
	var found bool
	err := f.view(func(tx *bolt.Tx) error {
		var err error
		e, found, err = ReadFeedEvent(tx.Bucket(store.BucketEvents), seq)
		return err
	})
	return e, found, err
}

// checkCursor verifies that c names an event this feed had (or the
// start); floor and floorAt are the feed's as read by the caller.
func (f *Feed) checkCursor(c stock.Cursor, floorAt stock.Cursor) error {
	floor := floorAt.Seq
	switch {
	case c.Seq == 0:
		return nil
	case c.Seq < floor:
		return fmt.Errorf("%w: %s (events up to %s are pruned)", stock.ErrCursorExpired, c, floorAt)
	case c.Seq == floor:
		if c != floorAt {
			return fmt.Errorf("%w: %s names no event of this feed", stock.ErrBadCursor, c)
		}
		return nil
	}
	e, ok, err := f.Event(c.Seq)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s (events up to it were pruned)", stock.ErrCursorExpired, c)
	}
	if e.Index != c.Index {
		return fmt.Errorf("%w: %s names no event of this feed", stock.ErrBadCursor, c)
	}
	return nil
}

// Read returns up to limit events after cursor after, in order; applied
// is the ledger's applied index (a cursor beyond it: Behind).
// Errors: ErrCursorExpired for a cursor older than retention,
// ErrBadCursor for one that names no event of the feed.
func (f *Feed) Read(after stock.Cursor, limit int, applied uint64) (stock.FeedPage, error) {
	f.mu.RLock()
	visible, floorAt := f.visible, f.floorAt
	floor := floorAt.Seq
	memFirst := f.mem.firstSeq()
	f.mu.RUnlock()
	page := stock.FeedPage{}
	if visible > 0 {
		head, ok, err := f.Event(visible)
		if err != nil {
			return page, err
		}
		if ok {
			page.Head = head.Cursor()
		}
	}
	if after.Seq > visible {
		if after.Index > applied {
			page.Behind = true
			return page, nil
		}
		return page, fmt.Errorf("%w: %s is beyond the feed's newest event %s", stock.ErrBadCursor, after, page.Head)
	}
	if err := f.checkCursor(after, floorAt); err != nil {
		return page, err
	}
	from := max(after.Seq, floor) + 1
	to := min(visible, from+uint64(limit)-1)
	if from > to {
		return page, nil
	}
	page.Events = make([]stock.FeedEvent, 0, to-from+1)
	if memFirst == 0 || from < memFirst {
		// The older part is in bbolt only.
		end := to
		if memFirst != 0 {
			end = min(to, memFirst-1)
		}
		err := f.view(func(tx *bolt.Tx) error {
			cur := tx.Bucket(store.BucketEvents).Cursor()
			want := from
			for k, v := seekFeedChunk(cur, from); len(k) == 8 && want <= end; k, v = cur.Next() {
				if binary.BigEndian.Uint64(k) > want {
					break // pruned under us
				}
				err := EachFeedEvent(binary.BigEndian.Uint64(k), v, want, end, func(e *stock.FeedEvent) bool {
					page.Events = append(page.Events, *e)
					want++
					return true
				})
				if err != nil {
					return err
				}
			}
			if want <= end {
				return fmt.Errorf("%w: %s (events after it were pruned while reading)", stock.ErrCursorExpired, after)
			}
			return nil
		})
		if err != nil {
			return page, err
		}
		from = end + 1
	}
	f.mu.RLock()
	want := from
	f.mem.from(from, func(e *stock.FeedEvent) bool {
		if e.Seq != want || want > to {
			return false // trimmed under us: the caller reads on from the last event
		}
		page.Events = append(page.Events, *e)
		want++
		return true
	})
	f.mu.RUnlock()
	return page, nil
}

// Changed returns a channel closed when new events are published (or
// the ledger is replaced or closed): long-polling readers wait on it.
func (f *Feed) Changed() <-chan struct{} { return f.changed() }

// Stats reads the feed's head, floor and consumers.
func (f *Feed) Stats() (stock.FeedStats, error) {
	f.mu.RLock()
	st := stock.FeedStats{Floor: f.floorAt, Retained: f.visible - min(f.floorAt.Seq, f.visible)}
	visible := f.visible
	for _, c := range f.consumers {
		st.Consumers = append(st.Consumers, c)
	}
	f.mu.RUnlock()
	slices.SortFunc(st.Consumers, func(a, b stock.Consumer) int { return strings.Compare(a.Name, b.Name) })
	if visible > 0 {
		e, ok, err := f.Event(visible)
		if err != nil {
			return st, err
		}
		if ok {
			st.Head, st.HeadAt = e.Cursor(), e.At
		}
	}
	return st, nil
}

// CursorBefore is the cursor of the newest event older than
// atUnixNano, and whether there is one after the floor: retention by time
// prunes up to it.
func (f *Feed) CursorBefore(atUnixNano int64) (stock.Cursor, bool, error) {
	f.mu.RLock()
	lo, hi := f.floorAt.Seq+1, f.visible // search (floor, visible]
	f.mu.RUnlock()
	var best stock.Cursor
	found := false
	for lo <= hi {
		mid := lo + (hi-lo)/2
		e, ok, err := f.Event(mid)
		if err != nil {
			return stock.Cursor{}, false, err
		}
		if !ok { // pruned meanwhile: look above
			lo = mid + 1
			continue
		}
		if e.At < atUnixNano {
			best, found = e.Cursor(), true
			lo = mid + 1
		} else {
			hi = mid - 1
		}
	}
	return best, found, nil
}

// NewestCursorIn is the cursor of the newest event the file tx reads
// holds, or names as its floor when that event was pruned (zero: none).
func NewestCursorIn(tx *bolt.Tx) (stock.Cursor, error) {
	meta := tx.Bucket(store.BucketMeta)
	v := meta.Get(store.KeyFeedSeq)
	if len(v) != 8 {
		return stock.Cursor{}, nil
	}
	seq := binary.BigEndian.Uint64(v)
	if e, ok, err := ReadFeedEvent(tx.Bucket(store.BucketEvents), seq); err != nil || ok {
		return e.Cursor(), err
	}
	if fv := meta.Get(store.KeyFeedFloor); fv != nil {
		if c, err := DecodeCursor(fv); err == nil && c.Seq == seq {
			return c, nil // the newest event was pruned
		}
	}
	return stock.Cursor{}, nil
}
