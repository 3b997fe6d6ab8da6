package raftfsm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/orderfeed"
	"stockd.dev/stockd/raftfsm/requestindex"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/raftfsm/waitroom"

	"stockd.dev/stockd/internal/hashfilter"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// EventKind says what an Event reports.
type EventKind uint8

// Events the ledger reports to its Observer after a batch commits.
const (
	EventSaleCreated    EventKind = iota + 1 // a new sale of Qty units
	EventLeaseGranted                        // Qty units of SKU leased to Node
	EventLeaseReturned                       // Qty units of SKU returned by Node
	EventReclaimed                           // all of Node's leases went back to available
	EventStockChanged                        // Available of SKU rose (restock, release)
	EventReplaced                            // the whole state was replaced by a snapshot restore
	EventNodeRegistered                      // Node registered (or changed) its HTTP address
	EventLeaseWanted                         // Node wanted Qty more units of SKU than available; others hold leases
	EventSaleClosed                          // SKU was closed: every lease went back to available
	EventQueueChanged                        // the batch changed queued sale SKU (tickets, admissions, keys, its stock)
)

// Event is a state change an engine must react to, with the log index that
// caused it.
type Event struct {
	Kind  EventKind
	Index uint64
	Node  string
	SKU   string
	Qty   int64
}

// Observer receives the ledger's events. Applied is called on the FSM
// goroutine after each batch is durable, in log order; it must not block for
// long and must not call back into raft.
type Observer interface {
	Applied(events []Event)
}

// Ledger is the replicated ledger: a raft.BatchingFSM whose state lives in
// bbolt. ApplyBatch, Snapshot and Restore are called by raft on its FSM
// goroutine; the read methods may be called from any goroutine.
type Ledger struct {
	path   string
	logger *slog.Logger

	obsMu    sync.RWMutex
	observer Observer

	mu      sync.RWMutex // guards db swaps in Restore and the mirrors below
	db      *bolt.DB
	bh      *store.WriteBehind // changes applied and not yet in bbolt, and their persister
	applied uint64
	rules   uint64 // the ledger's rules (rules.go)
	// restoredFrom and restoredAt: a ledger restored from a backup at
	// index restoredFrom went on at restoredAt (restore.go); zero else.
	restoredFrom, restoredAt uint64
	clusterID                string // the restored cluster's identity (restore.go)
	skus                     map[string]*stock.SKU
	requests                 *requestindex.Index // request id -> where its order id is
	// reqSeed hashes request ids and buyer keys, for the whole life of the
	// ledger; reqFilter and buyerFilter answer "surely not" without a lock.
	reqSeed   maphash.Seed
	reqFilter atomic.Pointer[hashfilter.Filter]
	noLine    atomic.Uint64 // RequestLine's word while reqFilter is nil
	// legacyRequests: requests holds ids of the rules before scoped ids
	// (requestIndex.legacy), which reads then look up too.
	legacyRequests atomic.Bool
	buyerFilter    atomic.Pointer[hashfilter.Filter]
	nodes          map[string]string // node id -> HTTP address
	holds          map[string]int64  // held order id -> expires at (unix nanos)
	bought         map[string]int64  // buyerKey(sku, user) -> units held or sold, for per_user sales
	// orderSeqs is, per node, the highest sequence among the order ids it
	// minted and which of its latest have orders (seqWindow). Read and
	// written on the FSM goroutine only (and by loadMirrors before raft
	// starts or inside Restore).
	orderSeqs map[string]*seqWindow
	// feed is the order feed; feedOff stops recording it (every node of
	// a cluster must agree, from its first start).
	feed    orderfeed.Feed
	feedOff atomic.Bool
	// rankings caches drawn lotteries' rankings.
	rankings lottery.Rankings

	appliedMu sync.Mutex
	appliedCh chan struct{} // closed and replaced whenever applied advances

	// test holds the hooks of this package's tests; nothing else sets it.
	test testHooks

	// applyMu is held while a batch is applied (see behind.applying).
	applyMu sync.Mutex
	// growingBlocks holds, by key, the order blocks that batches have been
	// adding members to, as the values they last wrote: the next batch
	// appends in place (see flushOrderBlock). Only the apply goroutine,
	// holding applyMu, touches it.
	growingBlocks map[string][]byte
	// requestChangesSpare is the last batch's request changes map, empty,
	// for the next (spareRequestChanges); the apply goroutine's alone.
	requestChangesSpare map[string]requestChange
	// prunedSpare is the last prune's pruned-id list, empty, for the next
	// (sparePruned); the apply goroutine's alone.
	prunedSpare []prunedRequest
	// addsSpare is the last batch's list of request ids to index, empty,
	// for the next (updateMirrors); the apply goroutine's alone.
	addsSpare []requestindex.Entry
	// requestGroupsAtMax is the highest time (as the group key's uint64)
	// any record of the requests-by-time bucket has been written at: no
	// group exists above it, so a take's entry, whose time is mostly
	// newer than every group's, writes its group without first looking
	// in the file for one. Set by loadMirrors, raised by putRequestGroup;
	// the apply goroutine's.
	requestGroupsAtMax uint64
	// compactMu serialises compactions; closing tells one to give up and
	// makes Close wait for it.
	compactMu sync.Mutex
	closing   atomic.Bool

	// applyDelay stalls every batch this long before it is applied: a
	// slow ledger, for tests and benches of admission (SetApplyDelay).
	applyDelay atomic.Int64

	restores        atomic.Uint64 // snapshots restored since start
	persistFault    atomic.Pointer[func() error]
	persistFailing  atomic.Bool
	persistFailures atomic.Uint64
}

// testHooks are what this package's tests (and export_test.go's helpers
// for raftfsm_test) set on a ledger; a ledger opened by OpenLedger has
// none. Faults a serving node can be given on purpose (a slow apply, a
// failing disk) are SetApplyDelay and SetPersistFault instead.
type testHooks struct {
	// afterCommit runs between a batch's hand-over to the persister and
	// the mirrors' update: a test reads in that window.
	afterCommit func()
	// noFinalWrite makes Close skip its last write (a crash before the
	// ledger's write, with the persister halted).
	noFinalWrite bool
}

// ErrLedgerClosed is returned by reads after Close.
var ErrLedgerClosed = errors.New("ledger closed")

// checkLedgerSize refuses a ledger file shorter than its own pages say
// (cut short by a full disk, or a copy that did not finish): reading past
// the end of the mapped file kills the process with SIGBUS instead of
// failing. It looks before the file is opened for writing, because that
// open already reads the free-page list, which may lie past the end; a
// read-only open reads only the two meta pages.
func checkLedgerSize(path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && st.Size() == 0) {
		return nil // a new ledger
	}
	if err != nil {
		return fmt.Errorf("open ledger %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: store.OpenTimeout})
	if err != nil {
		return ledgerOpenError(path, err)
	}
	defer db.Close()
	var need int64
	if err := db.View(func(tx *bolt.Tx) error { need = tx.Size(); return nil }); err != nil {
		return fmt.Errorf("open ledger %s: %w", path, err)
	}
	if st.Size() < need {
		return fmt.Errorf("ledger %s is cut short: %d bytes on disk, its pages need %d (a disk that filled up, or a copy that did not finish); %s", path, st.Size(), need, ledgerRepair)
	}
	return nil
}

// ledgerRepair is what an operator can do about a damaged ledger.db.
const ledgerRepair = "restore it from a backup, or move it away and the node rebuilds it from its raft log, snapshots and peers"

// ledgerOpenError says what a failed open of the ledger file means and
// what the operator can do.
func ledgerOpenError(path string, err error) error {
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("open ledger %s: %w (another process has it open: is a node already running on this data dir?)", path, err)
	}
	return fmt.Errorf("open ledger %s: %w (a damaged file: %s)", path, err, ledgerRepair)
}

// OpenLedger opens (or creates) the ledger file in dir and loads its mirrors.
func OpenLedger(dir string, logger *slog.Logger) (*Ledger, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create ledger dir %s: %w", dir, err)
	}
	l := &Ledger{path: filepath.Join(dir, store.FileName), logger: logger, reqSeed: maphash.MakeSeed()}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Ledger) open() error {
	db, err := l.openFile()
	if err != nil {
		return err
	}
	l.db = db
	l.bh = store.NewWriteBehind(l.applied, &l.applyMu, &l.feed)
	l.feed.SetView(l.view)
	l.bh.SetFault(l.persistFault.Load())
	l.bh.Start(db, ledgerPersistHealth{l: l, bh: l.bh})
	return nil
}

// openFile opens the ledger file for writing and loads the mirrors from
// it. bbolt panics on a page it cannot make sense of (a file overwritten
// in the middle); that becomes an error naming the file, as a file cut
// short does.
func (l *Ledger) openFile() (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			db, err = nil, fmt.Errorf("ledger %s is damaged: %v (%s)", l.path, r, ledgerRepair)
		}
	}()
	if err := checkLedgerSize(l.path); err != nil {
		return nil, err
	}
	db, err = bolt.Open(l.path, 0o600, &bolt.Options{Timeout: store.OpenTimeout, InitialMmapSize: store.MmapBytes})
	if err != nil {
		return nil, ledgerOpenError(l.path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := store.CheckFormat(tx.Bucket(store.BucketMeta)); err != nil {
			return err
		}
		for _, name := range append([][]byte{store.BucketMeta, store.BucketSKUs, store.BucketOrders, store.BucketBuyers, store.BucketNodes, store.BucketRequestsByTime, store.BucketEvents, store.BucketConsumers, store.BucketEntries, store.BucketEntryUsers}, waitroom.Buckets...) {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		// From here on the file may hold records of this format.
		return tx.Bucket(store.BucketMeta).Put(store.KeyFormat, binary.BigEndian.AppendUint32(nil, store.Format))
	})
	if err == nil {
		err = l.loadMirrors(db)
		store.DropResidentPages(db)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("load ledger %s: %w", l.path, err)
	}
	return db, nil
}

// SetObserver installs the receiver of events. Call it before raft starts,
// or accept that events before the call are not seen.
func (l *Ledger) SetObserver(o Observer) {
	l.obsMu.Lock()
	l.observer = o
	l.obsMu.Unlock()
}

// Close writes what is still pending and closes the ledger file.
func (l *Ledger) Close() error {
	// A compaction holds the persister: let it finish or give up first.
	l.closing.Store(true)
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		return nil
	}
	l.bh.Halt()
	var err error
	if !l.test.noFinalWrite {
		err = l.bh.Flush()
	}
	if cerr := l.db.Close(); err == nil {
		err = cerr
	}
	l.db = nil
	l.feed.Wake()
	return err
}

// SetApplyDelay makes every batch wait d before it is applied (0: none):
// a slow ledger, for tests and benches. Commits on this node then answer
// that much later; on a leader, every commit of the cluster does.
func (l *Ledger) SetApplyDelay(d time.Duration) { l.applyDelay.Store(int64(d)) }

// SetFeed turns the recording of order events on or off (on by default).
// Every node of a cluster must run with the same setting from its first
// start: the feed's numbering is part of the replicated state.
func (l *Ledger) SetFeed(on bool) { l.feedOff.Store(!on) }

// FeedOn reports whether the ledger records order events.
func (l *Ledger) FeedOn() bool { return !l.feedOff.Load() }

// NodeAddrs returns the HTTP address every registered node gave.
func (l *Ledger) NodeAddrs() map[string]string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return maps.Clone(l.nodes)
}

// WaitApplied blocks until the ledger holds log index or ctx ends.
func (l *Ledger) WaitApplied(ctx context.Context, index uint64) error {
	for {
		l.appliedMu.Lock()
		if l.appliedCh == nil {
			l.appliedCh = make(chan struct{})
		}
		ch := l.appliedCh
		l.appliedMu.Unlock()
		if l.AppliedIndex() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for log index %d (ledger at %d): %w", index, l.AppliedIndex(), ctx.Err())
		}
	}
}

func (l *Ledger) notifyApplied() {
	l.appliedMu.Lock()
	if l.appliedCh != nil {
		close(l.appliedCh)
		l.appliedCh = nil
	}
	l.appliedMu.Unlock()
}

// AppliedIndex is the last log index whose effects are in the ledger.
func (l *Ledger) AppliedIndex() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.applied
}

// view runs fn in a bbolt read transaction without holding l.mu, so a long
// read (an audit) never holds up Apply, which takes l.mu to update the
// mirrors. The transaction begins under l.mu: a Restore or a compaction
// that swaps the file closes the old one only once it has ended.
func (l *Ledger) view(fn func(tx *bolt.Tx) error) error {
	tx, err := l.beginRead()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return fn(tx)
}

// beginRead begins a read transaction on the current file.
func (l *Ledger) beginRead() (*bolt.Tx, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return nil, ErrLedgerClosed
	}
	return l.db.Begin(false)
}
