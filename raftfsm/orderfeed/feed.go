// Package orderfeed is the ledger's order feed (docs/feed-and-lottery.md):
// every order event the ledger applies (an order created, confirmed or
// released) gets the next sequence number of the feed, in log order. Every
// node applies the same log, so every node numbers the same events the same
// way, and a consumer may read a page from one node and the next from
// another.
//
// Events live in bbolt (bucket events, keyed by sequence) and, until the
// persister has written them and for a while after, in memory: the newest
// events, which long-polling consumers read, never touch bbolt. The feed
// is pruned through the log (PruneEvents): every node refuses the same
// cursors. The persister deletes pruned events from bbolt lazily.
package orderfeed

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// MemoryEvents is how many events already in bbolt the feed keeps in
// memory besides those not yet written: consumers that keep up read from
// memory.
const MemoryEvents = 16384

// feedDeleteMax bounds the pruned events one write deletes from bbolt.
const feedDeleteMax = 50_000

// Feed is the ledger's order feed. The FSM goroutine stages a batch's
// events before it hands the batch to the persister and publishes them
// with the batch; readers see published events only.
type Feed struct {
	mu sync.RWMutex
	// mem holds events in order: every event not yet in bbolt, and up to
	// about MemoryEvents before them.
	mem       eventChunks
	seq       uint64 // the last event staged
	visible   uint64 // the last event published
	persisted uint64 // the last event in bbolt
	// floorAt is the last pruned event (zero when nothing was pruned):
	// events at or below its sequence are gone, and readers after an
	// older cursor get ErrCursorExpired.
	floorAt   stock.Cursor
	notify    chan struct{}
	consumers map[string]stock.Consumer
	// gen counts loads: a persister of a ledger file a restore replaced
	// may finish a write after the load, and must not count it.
	gen uint64
	// view runs fn in a read transaction of the ledger file (the events
	// older than those in memory are there).
	view func(fn func(tx *bolt.Tx) error) error
}

// SetView gives the feed its way into the ledger file: view runs fn in a
// read transaction of the file as it is now.
func (f *Feed) SetView(view func(fn func(tx *bolt.Tx) error) error) { f.view = view }

// Load reads the feed's state from a ledger file.
func (f *Feed) Load(tx *bolt.Tx) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.mem, f.seq, f.floorAt = eventChunks{}, 0, stock.Cursor{}
	f.consumers = map[string]stock.Consumer{}
	meta := tx.Bucket(store.BucketMeta)
	if v := meta.Get(store.KeyFeedSeq); len(v) == 8 {
		f.seq = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(store.KeyFeedFloor); v != nil {
		c, err := DecodeCursor(v)
		if err != nil {
			return fmt.Errorf("feed floor: %w", err)
		}
		f.floorAt = c
	}
	f.visible, f.persisted = f.seq, f.seq
	return tx.Bucket(store.BucketConsumers).ForEach(func(k, v []byte) error {
		c, err := decodeConsumer(string(k), v)
		if err != nil {
			return err
		}
		f.consumers[c.Name] = c
		return nil
	})
}

// Stage adds a batch's events (numbered after f.seq by the applier), which
// the feed keeps as they are: the applier leaves them alone afterwards.
func (f *Feed) Stage(events []stock.FeedEvent) {
	if len(events) == 0 {
		return
	}
	f.mu.Lock()
	f.mem.addBatch(events)
	f.seq = events[len(events)-1].Seq
	f.mu.Unlock()
}

// Last is the last event staged and the last pruned: where a batch's
// events and prunes go on from.
func (f *Feed) Last() (seq uint64, floorAt stock.Cursor) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.seq, f.floorAt
}

// Consumers is a copy of the registered consumers by name.
func (f *Feed) Consumers() map[string]stock.Consumer {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.consumers)
}

// MemEvent reads event seq if memory holds it.
func (f *Feed) MemEvent(seq uint64) (stock.FeedEvent, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.memEvent(seq)
}

// InMemory is what the feed holds in memory: its first event (0: none)
// and how many events.
func (f *Feed) InMemory() (first uint64, events int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, c := range f.mem.chunks {
		events += len(c)
	}
	return f.mem.firstSeq(), events
}

// HasConsumer reports whether consumer name is registered.
func (f *Feed) HasConsumer(name string) bool {
	_, ok := f.Consumer(name)
	return ok
}

// Consumer is consumer name as registered (ok false: it is not).
func (f *Feed) Consumer(name string) (c stock.Consumer, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok = f.consumers[name]
	return c, ok
}

// Publish applies a batch's consumer changes (nil: dropped) and its new
// floor (nil: none), then makes every staged event visible.
func (f *Feed) Publish(consumers map[string]*stock.Consumer, floorAt *stock.Cursor) {
	if len(consumers) > 0 || floorAt != nil {
		f.mu.Lock()
		for name, c := range consumers {
			if c == nil {
				delete(f.consumers, name)
			} else {
				f.consumers[name] = *c
			}
		}
		if floorAt != nil {
			f.floorAt = *floorAt
		}
		f.mu.Unlock()
	}
	f.publish()
}

// publish makes every staged event visible and wakes waiting readers.
func (f *Feed) publish() {
	f.mu.Lock()
	if f.visible == f.seq {
		f.mu.Unlock()
		return
	}
	f.visible = f.seq
	ch := f.notify
	f.notify = nil
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// Wake wakes waiting readers without new events (a restore, a close).
func (f *Feed) Wake() {
	f.mu.Lock()
	ch := f.notify
	f.notify = nil
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// changed returns a channel closed at the next publish.
func (f *Feed) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notify == nil {
		f.notify = make(chan struct{})
	}
	return f.notify
}

// memEvent returns event seq from memory; f.mu is held.
func (f *Feed) memEvent(seq uint64) (stock.FeedEvent, bool) {
	if e := f.mem.get(seq); e != nil {
		return *e, true
	}
	return stock.FeedEvent{}, false
}

// eventChunks is events in consecutive sequence, in chunks of any size:
// each chunk is one batch's events, adopted as the applier built them, so
// an event is never copied. The memory grows and shrinks by whole chunks.
type eventChunks struct {
	chunks [][]stock.FeedEvent // none empty
	firsts []uint64            // firsts[i] is the sequence of chunks[i][0]
}

// addBatch adopts events, which follow the last event held; the caller
// does not change them afterwards.
func (m *eventChunks) addBatch(events []stock.FeedEvent) {
	if len(events) == 0 {
		return
	}
	m.chunks = append(m.chunks, events)
	m.firsts = append(m.firsts, events[0].Seq)
}

// firstSeq is the first event held (0: none).
func (m *eventChunks) firstSeq() uint64 {
	if len(m.chunks) == 0 {
		return 0
	}
	return m.firsts[0]
}

// chunkAt is the last chunk whose first event is at or below seq (-1:
// none).
func (m *eventChunks) chunkAt(seq uint64) int {
	return sort.Search(len(m.firsts), func(i int) bool { return m.firsts[i] > seq }) - 1
}

func (m *eventChunks) get(seq uint64) *stock.FeedEvent {
	c := m.chunkAt(seq)
	if c < 0 {
		return nil
	}
	if i := seq - m.firsts[c]; i < uint64(len(m.chunks[c])) {
		return &m.chunks[c][i]
	}
	return nil
}

// from calls fn for the events held from seq on, in order, until fn
// returns false.
func (m *eventChunks) from(seq uint64, fn func(*stock.FeedEvent) bool) {
	for c := max(m.chunkAt(seq), 0); c < len(m.chunks); c++ {
		chunk := m.chunks[c]
		for i := max(seq, m.firsts[c]) - m.firsts[c]; i < uint64(len(chunk)); i++ {
			if !fn(&chunk[i]) {
				return
			}
		}
	}
}

// dropBefore forgets the whole chunks that hold only events below seq;
// the last chunk stays.
func (m *eventChunks) dropBefore(seq uint64) {
	drop := 0
	for drop < len(m.chunks)-1 && m.firsts[drop]+uint64(len(m.chunks[drop])) <= seq {
		drop++
	}
	if drop > 0 {
		m.chunks = slices.Delete(m.chunks, 0, drop)
		m.firsts = slices.Delete(m.firsts, 0, drop)
	}
}

// Persist writes to tx, inside the persister's transaction that takes
// bbolt to index target, the events applied up to target, and deletes
// pruned events (up to feedDeleteMax a write). It returns the feed's
// generation and the last event written, for written.
func (f *Feed) Persist(tx *bolt.Tx, target uint64) (gen, last uint64, err error) {
	f.mu.RLock()
	gen, last = f.gen, f.persisted
	// Pointers into the chunks: an event there never changes, and its
	// chunk is dropped only after written, which follows this write.
	var batch []*stock.FeedEvent
	f.mem.from(f.persisted+1, func(e *stock.FeedEvent) bool {
		if e.Index > target {
			return false
		}
		batch = append(batch, e)
		return true
	})
	f.mu.RUnlock()
	events := tx.Bucket(store.BucketEvents)
	events.FillPercent = store.PersistFillPercent
	// bbolt keeps the key and value slices until the transaction ends:
	// one buffer for all, carved up, never reused.
	size := 0
	for i := 0; i < len(batch); i += DiskChunkEvents {
		size += 8 + feedChunkBytes(batch[i:min(i+DiskChunkEvents, len(batch))])
	}
	buf := make([]byte, 0, size+8)
	for i := 0; i < len(batch); i += DiskChunkEvents {
		part := batch[i:min(i+DiskChunkEvents, len(batch))]
		start := len(buf)
		buf = binary.BigEndian.AppendUint64(buf, part[0].Seq)
		mid := len(buf)
		buf = appendFeedChunk(buf, part)
		if err := events.Put(buf[start:mid:mid], buf[mid:len(buf):len(buf)]); err != nil {
			return 0, 0, err
		}
		last = part[len(part)-1].Seq
	}
	if len(batch) > 0 {
		if err := tx.Bucket(store.BucketMeta).Put(store.KeyFeedSeq, binary.BigEndian.AppendUint64(nil, last)); err != nil {
			return 0, 0, err
		}
	}
	// The floor as of target: the pending changes this transaction wrote
	// include it.
	var floor uint64
	if v := tx.Bucket(store.BucketMeta).Get(store.KeyFeedFloor); v != nil {
		if c, err := DecodeCursor(v); err == nil {
			floor = c.Seq
		}
	}
	// Whole chunks at or below the floor go; one that straddles it stays
	// (readers never ask for an event at or below the floor).
	cur := events.Cursor()
	deleted := uint64(0)
	for k, v := cur.First(); len(k) == 8 && deleted < feedDeleteMax; k, v = cur.First() {
		n, err := feedChunkCount(v)
		if err != nil {
			return 0, 0, fmt.Errorf("feed chunk %d: %w", binary.BigEndian.Uint64(k), err)
		}
		if binary.BigEndian.Uint64(k)+n-1 > floor {
			break
		}
		if err := cur.Delete(); err != nil {
			return 0, 0, err
		}
		deleted += n
	}
	return gen, last, nil
}

// Written records that bbolt holds the events up to seq, and trims
// memory to the unwritten events and feedMemoryEvents before them (pruned
// ones go), in steps large enough that the copies stay cheap.
func (f *Feed) Written(gen, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen || seq <= f.persisted {
		return
	}
	f.persisted = seq
	keepFrom := f.floorAt.Seq + 1
	if f.persisted > MemoryEvents {
		keepFrom = max(keepFrom, f.persisted-MemoryEvents+1)
	}
	f.mem.dropBefore(min(keepFrom, f.persisted+1))
}

// EncodeFeedEvent appends e's record: format, type, index, time, order id,
// then the order's record.
func EncodeFeedEvent(dst []byte, e *stock.FeedEvent) []byte {
	dst = append(dst, feedRecordFormat, byte(e.Type))
	dst = wire.AppendUvarint(dst, e.Index)
	dst = wire.AppendVarint(dst, e.At)
	dst = wire.AppendString(dst, e.Order.ID)
	return store.EncodeOrderRecord(dst, &e.Order)
}

const feedRecordFormat byte = 0xE1

// feedEventSize bounds the bytes encodeFeedEvent appends for e.
func feedEventSize(e *stock.FeedEvent) int {
	o := &e.Order
	return 2 + 2*wire.MaxVarintBytes + wire.MaxVarintBytes + len(o.ID) + 2 + 3*wire.MaxVarintBytes +
		5*wire.MaxVarintBytes + len(o.SKU) + len(o.User) + len(o.RequestID) + len(o.Node) + len(o.ReleaseReason)
}

func decodeFeedEvent(seq uint64, b []byte) (stock.FeedEvent, error) {
	if len(b) < 2 || b[0] != feedRecordFormat {
		return stock.FeedEvent{}, fmt.Errorf("%w: feed event %d: not an event record", wire.ErrMalformed, seq)
	}
	e := stock.FeedEvent{Seq: seq, Type: stock.FeedEventType(b[1])}
	d := wire.Decoder{B: b[2:]}
	e.Index = d.Uvarint()
	e.At = d.Varint()
	id := d.String()
	if d.Err != nil {
		return stock.FeedEvent{}, fmt.Errorf("feed event %d: %w", seq, d.Err)
	}
	o, err := store.DecodeOrderRecord(id, d.B)
	if err != nil {
		return stock.FeedEvent{}, fmt.Errorf("feed event %d: %w", seq, err)
	}
	e.Order = o
	return e, nil
}

func EncodeCursor(c stock.Cursor) []byte {
	return wire.AppendUvarint(wire.AppendUvarint(make([]byte, 0, 2*wire.MaxVarintBytes), c.Index), c.Seq)
}

func DecodeCursor(b []byte) (stock.Cursor, error) {
	d := wire.Decoder{B: b}
	c := stock.Cursor{Index: d.Uvarint(), Seq: d.Uvarint()}
	return c, d.Finish()
}

func EncodeConsumer(c *stock.Consumer) []byte {
	b := EncodeCursor(c.Cursor)
	return wire.AppendVarint(b, c.AckedUnixNano)
}

func decodeConsumer(name string, b []byte) (stock.Consumer, error) {
	d := wire.Decoder{B: b}
	c := stock.Consumer{Name: name, Cursor: stock.Cursor{Index: d.Uvarint(), Seq: d.Uvarint()}, AckedUnixNano: d.Varint()}
	if err := d.Finish(); err != nil {
		return stock.Consumer{}, fmt.Errorf("consumer %q: %w", name, err)
	}
	return c, nil
}
