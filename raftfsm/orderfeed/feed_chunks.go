package orderfeed

import (
	"encoding/binary"
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// On disk the feed's events are kept in chunks: a value of the events
// bucket holds consecutive events, keyed by the first one's sequence
// (big-endian), so that a write stores a few hundred events with one
// B+tree insert instead of one each. A chunk is feedChunkFormat, the
// count of its events (big-endian uint32), then each event's record
// (encodeFeedEvent) after its length (big-endian uint32). A value that
// starts with feedRecordFormat is one event, as versions before chunks
// wrote them; both are read.
const feedChunkFormat byte = 0xE2

// DiskChunkEvents bounds a chunk: a reader of one event decodes no
// more than the lengths before it.
const DiskChunkEvents = 256

// feedChunkBytes bounds the bytes appendFeedChunk appends for events.
func feedChunkBytes(events []*stock.FeedEvent) int {
	n := 1 + 4
	for _, e := range events {
		n += 4 + feedEventSize(e)
	}
	return n
}

// appendFeedChunk appends the chunk of events, which are consecutive.
func appendFeedChunk(dst []byte, events []*stock.FeedEvent) []byte {
	dst = append(dst, feedChunkFormat)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(events)))
	for _, e := range events {
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst = EncodeFeedEvent(dst, e)
		binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	}
	return dst
}

// feedChunkCount is the number of events in value v.
func feedChunkCount(v []byte) (uint64, error) {
	switch {
	case len(v) > 0 && v[0] == feedRecordFormat:
		return 1, nil
	case len(v) >= 5 && v[0] == feedChunkFormat:
		return uint64(binary.BigEndian.Uint32(v[1:5])), nil
	}
	return 0, fmt.Errorf("%w: not a feed chunk", wire.ErrMalformed)
}

// EachFeedEvent decodes the events of the chunk at key first (value v)
// whose sequences lie in [from, to], in order, and calls fn for each
// until it returns false.
func EachFeedEvent(first uint64, v []byte, from, to uint64, fn func(*stock.FeedEvent) bool) error {
	n, err := feedChunkCount(v)
	if err != nil {
		return fmt.Errorf("feed chunk %d: %w", first, err)
	}
	if first > to || first+n <= from {
		return nil
	}
	if v[0] == feedRecordFormat {
		e, err := decodeFeedEvent(first, v)
		if err != nil {
			return err
		}
		fn(&e)
		return nil
	}
	rest := v[5:]
	for seq := first; seq < first+n && seq <= to; seq++ {
		if len(rest) < 4 {
			return fmt.Errorf("%w: feed chunk %d: event %d cut short", wire.ErrMalformed, first, seq)
		}
		size := binary.BigEndian.Uint32(rest)
		if uint64(size) > uint64(len(rest)-4) {
			return fmt.Errorf("%w: feed chunk %d: event %d cut short", wire.ErrMalformed, first, seq)
		}
		rec := rest[4 : 4+size]
		rest = rest[4+size:]
		if seq < from {
			continue
		}
		e, err := decodeFeedEvent(seq, rec)
		if err != nil {
			return err
		}
		if !fn(&e) {
			return nil
		}
	}
	return nil
}

// seekFeedChunk positions cur on the chunk that may hold event seq: the
// last one whose first sequence is at or below seq, or, when there is
// none, the first one after it.
func seekFeedChunk(cur *bolt.Cursor, seq uint64) (k, v []byte) {
	var key [8]byte
	binary.BigEndian.PutUint64(key[:], seq)
	k, v = cur.Seek(key[:])
	if k != nil && binary.BigEndian.Uint64(k) == seq {
		return k, v
	}
	if k == nil {
		k, v = cur.Last()
	} else {
		k, v = cur.Prev()
	}
	if k == nil {
		return cur.Seek(key[:])
	}
	return k, v
}

// ReadFeedEvent reads event seq from the events bucket b.
func ReadFeedEvent(b *bolt.Bucket, seq uint64) (stock.FeedEvent, bool, error) {
	k, v := seekFeedChunk(b.Cursor(), seq)
	if len(k) != 8 {
		return stock.FeedEvent{}, false, nil
	}
	var e stock.FeedEvent
	found := false
	err := EachFeedEvent(binary.BigEndian.Uint64(k), v, seq, seq, func(ev *stock.FeedEvent) bool {
		e, found = *ev, true
		return false
	})
	return e, found, err
}
