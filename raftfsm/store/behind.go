package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Write-behind (docs/architecture.md, "The write path"): Apply changes
// the ledger in memory and answers; a persister goroutine writes the
// changes to bbolt behind it, many batches to one transaction, with the
// index they reach. Only the raft log on a quorum stands between a take and
// its answer. After a crash the ledger opens at its persisted index and
// raft replays the entries after it (Apply is idempotent above that index).
//
// The changes not yet in bbolt live in pending: bucket -> key -> value
// (nil: deleted), each tagged with the log index that wrote it. Readers look
// in pending first, then in bbolt. An entry leaves pending only on the FSM
// goroutine, at the start of a batch, once bbolt holds it: so a read
// transaction the applier opens after that point sees everything pending
// no longer has.

const (
	// PersistInterval paces the persister when few changes wait. Each
	// write costs a bbolt commit (its dirty pages, two fdatasyncs) however
	// few changes it carries, and every node of a cluster pays it: at 50
	// ms the persister took 8-9 % of each node's CPU under 64 connections
	// of committed deducts, at 250 ms 3-4 % (docs/benchmarks.md). A crash
	// replays the entries since the last write from the raft log.
	PersistInterval = 250 * time.Millisecond
	// persistAfterChanges wakes the persister early.
	persistAfterChanges = 32768
	// PendingChangesMax bounds the changes waiting for bbolt (and so the
	// memory they take and the replay after a crash): Apply waits for the
	// persister beyond it.
	PendingChangesMax = 200_000
	// PendingChangesHardMax is where Apply stops while the persister
	// cannot write (a full or failing disk): up to it, applied changes
	// wait in memory (the raft log holds them too); at it, Apply waits
	// for a write up to persistStallMax, then the node stops.
	PendingChangesHardMax = 4 * PendingChangesMax
	PersistStallMax       = 30 * time.Second
	// PersistRetryMax caps the backoff between failed writes.
	PersistRetryMax = 2 * time.Second
	// PersistFillPercent is how full bbolt fills a page before it splits
	// it (bbolt's default, 0.5, suits random inserts).
	PersistFillPercent = 0.9
)

// pendingValue is one change not yet in bbolt.
type pendingValue struct {
	value []byte // nil: deleted
	index uint64 // the log index that wrote it
}

// loggedChange is one change as applied, in a bucket's log.
type loggedChange struct {
	key   string
	value []byte // nil: deleted
	index uint64
}

// WriteBehind is the ledger's write-behind state. mu guards pending and the
// indexes; persistMu serialises writes to bbolt.
type WriteBehind struct {
	mu      sync.RWMutex
	pending map[string]map[string]pendingValue // bucket -> key -> change
	// log holds each bucket's changes in the order they were applied,
	// from the first not yet forgotten on: the persister writes from it
	// (mostly in key order already, unlike a map's), and forgetting
	// visits only what was written. Its elements never change in place:
	// the persister reads them outside mu.
	log       map[string][]loggedChange
	changes   int    // entries in pending
	applied   uint64 // the index pending reaches
	persisted uint64 // the index bbolt holds
	forgotten uint64 // pending holds nothing at or below this index

	persistMu sync.Mutex
	// db is the file written, under persistMu (a compaction swaps it).
	db *bolt.DB
	// applying is held by the FSM goroutine for each batch: the persister
	// drops what it wrote from pending only while no batch runs (a batch
	// reads pending, then the file, and must see every change in one of
	// them), so an idle ledger does not keep its last changes twice.
	applying *sync.Mutex
	// rider writes its own state in the same transactions as the
	// changes (the order feed's events); nil: none.
	rider Rider
	// fault, when set, is asked before every write; an error fails the
	// write as the disk would (tests of a full disk).
	fault    atomic.Pointer[func() error]
	wake     chan struct{}
	stop     chan struct{}
	stopping atomic.Bool // stop is closed
	done     chan struct{}
}

// NewWriteBehind is the write-behind of a file that holds every change up
// to index persisted. applying is the lock the FSM goroutine holds for each
// batch; rider (nil: none) writes its own state in the persister's
// transactions.
func NewWriteBehind(persisted uint64, applying *sync.Mutex, rider Rider) *WriteBehind {
	return &WriteBehind{pending: map[string]map[string]pendingValue{}, log: map[string][]loggedChange{}, applied: persisted, persisted: persisted,
		applying: applying, rider: rider, wake: make(chan struct{}, 1)}
}

// SetFault makes every write ask fault first (nil: none); an error fails
// the write as the disk would.
func (b *WriteBehind) SetFault(fault *func() error) { b.fault.Store(fault) }

// Hold stops the persister's writes until the returned release is called,
// and says which file it writes: a compaction copies that file while
// held, flushes (FlushHeld) and swaps the copy in (SwapHeld).
func (b *WriteBehind) Hold() (db *bolt.DB, release func()) {
	b.persistMu.Lock()
	return b.db, b.persistMu.Unlock
}

// SwapHeld makes the persister write to db from now on; the caller holds
// the persister (Hold).
func (b *WriteBehind) SwapHeld(db *bolt.DB) { b.db = db }

// Get reads a pending change: found reports whether pending decides the
// key (value nil: deleted).
func (b *WriteBehind) Get(bucket, key []byte) (value []byte, found bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	pv, ok := b.pending[string(bucket)][string(key)]
	return pv.value, ok
}

// Merge adds a batch's changes, written at index; order lists each
// bucket's keys in the order the batch first changed them.
func (b *WriteBehind) Merge(batch map[string]map[string][]byte, order map[string][]string, index uint64) {
	b.mu.Lock()
	for bucket, keys := range order {
		kv := batch[bucket]
		m := b.pending[bucket]
		if m == nil {
			m = make(map[string]pendingValue, len(kv))
			b.pending[bucket] = m
		}
		lg := slices.Grow(b.log[bucket], len(keys))
		for _, k := range keys {
			v := kv[k]
			if _, had := m[k]; !had {
				b.changes++
			}
			m[k] = pendingValue{value: v, index: index}
			lg = append(lg, loggedChange{key: k, value: v, index: index})
		}
		b.log[bucket] = lg
	}
	b.applied = index
	n := b.changes
	b.mu.Unlock()
	if n >= persistAfterChanges {
		b.signal()
	}
}

func (b *WriteBehind) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// ForgetPersisted drops the changes bbolt now holds. The FSM goroutine
// calls it before it opens a read transaction for a batch, the persister
// while no batch runs (forgetIfIdle).
func (b *WriteBehind) ForgetPersisted() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changes == 0 || b.forgotten == b.persisted {
		return
	}
	b.forgotten = b.persisted
	for bucket, lg := range b.log {
		m := b.pending[bucket]
		i := 0
		for ; i < len(lg) && lg[i].index <= b.persisted; i++ {
			if pv, ok := m[lg[i].key]; ok && pv.index <= b.persisted {
				delete(m, lg[i].key)
				b.changes--
			}
		}
		if i == len(lg) {
			delete(b.log, bucket)
			if len(m) == 0 {
				delete(b.pending, bucket)
			}
			continue
		}
		// A reslice, never a copy down: the persister may be reading
		// the elements.
		b.log[bucket] = lg[i:]
	}
}

// forgetIfIdle drops the changes bbolt holds, unless a batch is being
// applied (it does so itself at the start of the next one).
func (b *WriteBehind) forgetIfIdle() {
	if b.applying == nil || !b.applying.TryLock() {
		return
	}
	defer b.applying.Unlock()
	b.ForgetPersisted()
}

// Lag is the log entries applied but not yet in bbolt, and the changes
// waiting.
func (b *WriteBehind) Lag() (entries uint64, changes int) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.applied - b.persisted, b.changes
}

// Flush writes every pending change to the file in one transaction with
// the index it reaches. Safe from any goroutine; it does not remove the
// changes from pending (forgetPersisted does, on the FSM goroutine).
func (b *WriteBehind) Flush() error {
	b.persistMu.Lock()
	defer b.persistMu.Unlock()
	return b.FlushHeld()
}

// FlushHeld is Flush for a caller holding the persister (Hold).
func (b *WriteBehind) FlushHeld() error {
	db := b.db
	if f := b.fault.Load(); f != nil {
		if err := (*f)(); err != nil {
			return fmt.Errorf("persist ledger: %w", err)
		}
	}
	b.mu.RLock()
	target := b.applied
	if target == b.persisted {
		b.mu.RUnlock()
		return nil
	}
	// Each bucket's changes after the persisted index, as applied: the
	// elements stay as they are while this reads them outside mu.
	byBucket := make(map[string][]loggedChange, len(b.log))
	for bucket, lg := range b.log {
		i, _ := slices.BinarySearchFunc(lg, b.persisted+1, func(c loggedChange, index uint64) int { return cmp.Compare(c.index, index) })
		if i < len(lg) {
			byBucket[bucket] = lg[i:len(lg):len(lg)]
		}
	}
	b.mu.RUnlock()
	var feedGen, feedSeq uint64
	err := db.Update(func(tx *bolt.Tx) error {
		for bucket, cs := range byBucket {
			bk := tx.Bucket([]byte(bucket))
			if bk == nil {
				return fmt.Errorf("BUG: no bucket %q", bucket)
			}
			// Keys arrive mostly in order (log order, sequences, times):
			// fill pages instead of splitting them half empty.
			bk.FillPercent = PersistFillPercent
			// In key order: each key is put once, with its last value,
			// and bbolt appends to a node instead of shifting its keys.
			// The log is mostly in key order already (sequences, times),
			// which pdqsort finds cheap.
			order := make([]int32, len(cs))
			for i := range order {
				order[i] = int32(i)
			}
			slices.SortFunc(order, func(x, y int32) int {
				if c := strings.Compare(cs[x].key, cs[y].key); c != 0 {
					return c
				}
				return cmp.Compare(x, y)
			})
			for j, i := range order {
				if j+1 < len(order) && cs[order[j+1]].key == cs[i].key {
					continue // a later change of the same key follows
				}
				c := &cs[i]
				key := []byte(c.key)
				var err error
				if c.value == nil {
					err = bk.Delete(key)
				} else {
					err = bk.Put(key, c.value)
				}
				if err != nil {
					return err
				}
			}
		}
		if b.rider != nil {
			var err error
			if feedGen, feedSeq, err = b.rider.Persist(tx, target); err != nil {
				return fmt.Errorf("order feed: %w", err)
			}
		}
		var idx [8]byte
		binary.BigEndian.PutUint64(idx[:], target)
		return tx.Bucket(BucketMeta).Put(keyApplied, idx[:])
	})
	if err != nil {
		return fmt.Errorf("persist ledger up to index %d: %w", target, err)
	}
	b.mu.Lock()
	b.persisted = target
	b.mu.Unlock()
	if b.rider != nil {
		b.rider.Written(feedGen, feedSeq)
	}
	return nil
}

// Rider is a part of the ledger that keeps its own state besides the
// staged changes and writes it in the persister's transactions: Persist
// writes what it holds up to index in tx and says what it wrote (gen, seq:
// its own bookkeeping); Written hears that tx committed.
type Rider interface {
	Persist(tx *bolt.Tx, index uint64) (gen, seq uint64, err error)
	Written(gen, seq uint64)
}

// PersistHealth hears how the persister's writes go: Failed after each
// failure, Succeeded after each success (a ledger's writes may have failed
// in a persister a snapshot restore has since replaced).
type PersistHealth interface {
	Failed(err error, attempt int)
	Succeeded()
}

// run is the persister goroutine: it flushes every persistInterval, or
// sooner when many changes wait, until stop closes. A write that fails
// leaves its changes pending (bbolt rolled the transaction back) and is
// tried again after a backoff growing to persistRetryMax.
func (b *WriteBehind) run(health PersistHealth) {
	defer close(b.done)
	t := time.NewTicker(PersistInterval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.wake:
		}
		if err := b.Flush(); err != nil {
			failures++
			health.Failed(err, failures)
			backoff := time.NewTimer(min(PersistInterval<<min(failures, 6), PersistRetryMax))
			select {
			case <-b.stop:
				backoff.Stop()
				return
			case <-backoff.C:
			}
			continue
		}
		failures = 0
		health.Succeeded()
		b.forgetIfIdle()
	}
}

// Start runs the persister over db.
func (b *WriteBehind) Start(db *bolt.DB, health PersistHealth) {
	b.stop, b.done = make(chan struct{}), make(chan struct{})
	b.stopping.Store(false)
	b.persistMu.Lock()
	b.db = db
	b.persistMu.Unlock()
	go b.run(health)
}

// Halt stops the persister (it does not flush).
func (b *WriteBehind) Halt() {
	if b.stop == nil {
		return
	}
	b.StopAsync()
	<-b.done
	b.stop = nil
}

// StopAsync tells the persister to stop without waiting for it; wait
// waits. A write in progress may still finish into the file.
func (b *WriteBehind) StopAsync() {
	if b.stop != nil && b.stopping.CompareAndSwap(false, true) {
		close(b.stop)
	}
}

func (b *WriteBehind) Wait() {
	if b.done != nil {
		<-b.done
	}
}

// Ascend calls fn for every key of bucket in order, pending changes over
// bbolt's, with batch's (the running batch's changes) over both; it stops
// when fn returns false.
func Ascend(tx *bolt.Tx, b *WriteBehind, batch map[string][]byte, bucket []byte, fn func(k, v []byte) bool) {
	AscendAfter(tx, b, batch, bucket, nil, fn)
}

// AscendAfter is ascend over the keys after from (all keys when from is nil).
func AscendAfter(tx *bolt.Tx, b *WriteBehind, batch map[string][]byte, bucket, from []byte, fn func(k, v []byte) bool) {
	over := map[string][]byte{}
	b.mu.RLock()
	for k, pv := range b.pending[string(bucket)] {
		if from == nil || k > string(from) {
			over[k] = pv.value
		}
	}
	b.mu.RUnlock()
	for k, v := range batch {
		if from == nil || k > string(from) {
			over[k] = v
		}
	}
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	cur := tx.Bucket(bucket).Cursor()
	k, v := cur.First()
	if from != nil {
		k, v = cur.Seek(from)
		if k != nil && bytes.Equal(k, from) {
			k, v = cur.Next()
		}
	}
	i := 0
	for k != nil || i < len(keys) {
		var key, val []byte
		switch {
		case i < len(keys) && (k == nil || bytes.Compare([]byte(keys[i]), k) <= 0):
			if k != nil && keys[i] == string(k) {
				k, v = cur.Next() // pending decides this key
			}
			key, val = []byte(keys[i]), over[keys[i]]
			i++
			if val == nil {
				continue // deleted
			}
		default:
			key, val = k, v
			k, v = cur.Next()
		}
		if !fn(key, val) {
			return
		}
	}
}
