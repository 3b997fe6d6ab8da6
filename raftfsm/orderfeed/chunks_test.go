package orderfeed

import (
	"slices"
	"stockd.dev/stockd/stock"
	"testing"
)

func TestEventChunks_AddGetDrop(t *testing.T) {
	var m eventChunks
	batch := func(from uint64, n int) []stock.FeedEvent {
		events := make([]stock.FeedEvent, n)
		for i := range events {
			events[i].Seq = from + uint64(i)
		}
		return events
	}
	m.addBatch(batch(5, 3)) // 5-7
	m.addBatch(nil)
	m.addBatch(batch(8, 1))   // 8
	m.addBatch(batch(9, 100)) // 9-108
	for _, seq := range []uint64{5, 6, 7, 8, 9, 50, 108} {
		if e := m.get(seq); e == nil || e.Seq != seq {
			t.Fatalf("get %d: %+v", seq, e)
		}
	}
	for _, seq := range []uint64{0, 4, 109} {
		if e := m.get(seq); e != nil {
			t.Fatalf("get %d: %+v, want none", seq, e)
		}
	}
	var seen []uint64
	m.from(7, func(e *stock.FeedEvent) bool {
		seen = append(seen, e.Seq)
		return e.Seq < 10
	})
	if !slices.Equal(seen, []uint64{7, 8, 9, 10}) {
		t.Fatalf("from 7: %v", seen)
	}
	seen = nil
	m.from(2, func(e *stock.FeedEvent) bool { seen = append(seen, e.Seq); return len(seen) < 2 })
	if !slices.Equal(seen, []uint64{5, 6}) {
		t.Fatalf("from before the first: %v", seen)
	}
	m.dropBefore(9) // the first two chunks are wholly below
	if m.firstSeq() != 9 || m.get(8) != nil || m.get(9) == nil || len(m.chunks) != 1 {
		t.Fatalf("after dropping: first %d, %d chunks", m.firstSeq(), len(m.chunks))
	}
	m.dropBefore(1 << 62) // the last chunk stays
	if len(m.chunks) != 1 || m.get(108) == nil {
		t.Fatalf("after dropping everything: %d chunks", len(m.chunks))
	}
}
