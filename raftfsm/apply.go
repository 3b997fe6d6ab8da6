package raftfsm

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"sort"
	"time"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/requestindex"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// Apply applies one log entry; raft uses ApplyBatch, this is for the FSM
// interface and for tests.
func (l *Ledger) Apply(log *raft.Log) interface{} {
	return l.ApplyBatch([]*raft.Log{log})[0]
}

// ApplyBatch applies a batch of committed entries in memory and hands the
// changes to the persister, which writes them to bbolt behind (see
// store.WriteBehind). Entries at or below the applied index are skipped (they
// were applied before a restart). It panics when the disk fails or an
// entry would break the conservation law: a node must not go on from a
// state it cannot trust.
func (l *Ledger) ApplyBatch(logs []*raft.Log) []interface{} {
	if d := l.applyDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // an injected slow ledger (SetApplyDelay)
	}
	l.applyMu.Lock()
	defer l.applyMu.Unlock()
	l.mu.RLock()
	db, applied, bh, rules := l.db, l.applied, l.bh, l.rules
	l.mu.RUnlock()
	if db == nil {
		panic("BUG: ApplyBatch on a closed ledger")
	}
	if _, changes := bh.Lag(); changes > store.PendingChangesMax {
		l.waitForPersister(bh, changes)
	}
	bh.ForgetPersisted()

	a := applier{ledger: l, bh: bh, batch: map[string]map[string][]byte{}, batchOrder: map[string][]string{}, touched: make(map[string]*stock.SKU),
		requestChanges: l.spareRequestChanges(), prunedRequests: l.sparePruned(), holdChanges: map[string]int64{},
		boughtChanges: map[string]int64{}, nodeChanges: map[string]string{}, rules: rules}
	defer a.closeTx()
	a.startFeed()
	results, last := a.applyEntries(logs, applied)
	if last == applied {
		return results
	}
	a.checkAndStageRows(last)
	l.feed.Stage(a.feed.events) // before the persister can see the batch
	bh.Merge(a.batch, a.batchOrder, last)
	if l.test.afterCommit != nil {
		l.test.afterCommit()
	}
	a.publish(last)
	l.keepRequestChanges(a.requestChanges)
	l.keepPruned(a.prunedRequests)
	if a.purgeDone {
		l.compactAsync()
	}
	return results
}

// waitForPersister writes the pending changes on the FSM goroutine when
// the persister is behind. While the disk fails, changes keep waiting in
// memory up to pendingChangesHardMax; there Apply waits for a write up to
// persistStallMax and then stops the node: everything it applied is in
// the raft log, which replays it at the next start.
func (l *Ledger) waitForPersister(bh *store.WriteBehind, changes int) {
	err := bh.Flush()
	if err == nil || changes <= store.PendingChangesHardMax {
		return
	}
	deadline := time.Now().Add(store.PersistStallMax)
	for backoff := store.PersistInterval; err != nil; backoff = min(2*backoff, store.PersistRetryMax) {
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("ledger %s: %d changes waiting and no write for %s: %v", l.path, changes, store.PersistStallMax, err))
		}
		time.Sleep(backoff)
		err = bh.Flush()
	}
}

// applyEntries applies every entry above applied and returns their
// results and the last index seen.
func (a *applier) applyEntries(logs []*raft.Log, applied uint64) ([]interface{}, uint64) {
	results := make([]interface{}, len(logs))
	last := applied
	for i, entry := range logs {
		if entry.Index <= applied {
			continue // applied before a restart; its result went to a proposer long gone
		}
		last = entry.Index
		if entry.Type != raft.LogCommand {
			continue
		}
		a.index = entry.Index
		at, cmd, err := command.DecodeCommand(entry.Data)
		if err != nil {
			results[i] = &command.Result{Outcome: stock.OutcomeInvalid, Detail: err.Error()}
			continue
		}
		a.at = at
		res, err := a.apply(cmd)
		if err != nil {
			panic(fmt.Sprintf("ledger %s: apply %s at index %d: %v", a.ledger.path, cmd.Op(), entry.Index, err))
		}
		for _, s := range a.queued {
			waitroom.Settle(s, at) // at this entry's time: batches differ between nodes
		}
		results[i] = res
	}
	return results, last
}

// checkAndStageRows checks the conservation law on every row the batch
// touched (a broken law is a bug: the node stops) and stages the rows.
func (a *applier) checkAndStageRows(last uint64) {
	for _, s := range a.queued {
		a.event(Event{Kind: EventQueueChanged, SKU: s.SKU})
	}
	for sku, s := range a.touched {
		if err := s.CheckLaw(); err != nil {
			panic(fmt.Sprintf("BUG: after index %d: %v", last, err))
		}
		b, err := json.Marshal(s)
		if err != nil {
			panic(fmt.Sprintf("BUG: encode sku %q: %v", sku, err))
		}
		a.put(store.BucketSKUs, []byte(sku), b)
	}
}

// publish makes the batch visible: rows and mirrors under the lock, then
// waiters on the applied index, then the observer's events.
func (a *applier) publish(last uint64) {
	l := a.ledger
	// The feed first: a reader that sees applied at last may be sent to
	// read events up to it.
	a.publishFeed()
	l.mu.Lock()
	for sku, s := range a.touched {
		l.skus[sku] = s
	}
	a.updateMirrors()
	l.rules = a.rules
	l.applied = last
	l.mu.Unlock()
	l.notifyApplied()

	if len(a.events) > 0 {
		l.obsMu.RLock()
		obs := l.observer
		l.obsMu.RUnlock()
		if obs != nil {
			obs.Applied(a.events)
		}
	}
}

// applier carries one batch's transaction and its working copies of the
// rows it touched; the *Changes maps hold what the in-memory mirrors must
// take on once the transaction has committed.
type applier struct {
	// prefetched sums the words prefetchRequests read ahead, so that
	// they are read.
	prefetched uint64
	ledger     *Ledger
	tx         *bolt.Tx // a read transaction, opened at the first read that pending cannot answer
	bh         *store.WriteBehind
	batch      map[string]map[string][]byte // this batch's changes: bucket -> key -> value (nil: deleted)
	// batchOrder lists each bucket's changed keys in the order first changed.
	batchOrder map[string][]string
	index      uint64
	at         int64 // the proposer's clock for the entry being applied
	// rules are the ledger's rules for the entry being applied (a
	// SetRules in the batch changes them for the entries after it).
	rules   uint64
	touched map[string]*stock.SKU
	queued  []*stock.SKU // touched rows of sales behind a waiting room
	events  []Event
	feed    feedBatch
	// purgeDone: an archived sale's last orders left in this batch (the
	// file may then be compacted).
	purgeDone bool

	requestChanges map[string]requestChange // request id -> its order, or a deletion
	// prunedRequests are request ids a prune forgot, taken out of the index
	// on publish before requestChanges. Lookups later in the batch need no
	// entry for them: the id's record is gone from the staged group, which
	// a lookup reads to verify the index's answer.
	prunedRequests []prunedRequest
	newRequests    []requestPair // the entry's new request ids, for its group
	// groups, while set, holds request groups decoded (holdRequestGroups);
	// groupsChanged marks those to write back.
	groups        map[int64][]requestPair
	groupsChanged map[int64]bool
	requestDelta  int64             // request ids added less those deleted by this batch
	legacyAdded   bool              // a key of the rules before scoped ids was added by this batch
	holdChanges   map[string]int64  // held order id -> expires at; -1 deletes
	boughtChanges map[string]int64  // buyer key -> units; 0 deletes
	nodeChanges   map[string]string // node id -> HTTP address
	block         openOrderBlock
}

// get reads key from this batch's changes, then pending, then bbolt. The
// value is valid until the batch ends; a nil value means absent.
func (a *applier) get(bucket, key []byte) ([]byte, error) {
	if v, ok := a.batch[string(bucket)][string(key)]; ok {
		return v, nil
	}
	if v, ok := a.bh.Get(bucket, key); ok {
		return v, nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	return tx.Bucket(bucket).Get(key), nil
}

func (a *applier) readTx() (*bolt.Tx, error) {
	if a.tx == nil {
		tx, err := a.ledger.beginRead()
		if err != nil {
			return nil, fmt.Errorf("read ledger: %w", err)
		}
		a.tx = tx
	}
	return a.tx, nil
}

func (a *applier) closeTx() {
	if a.tx != nil {
		_ = a.tx.Rollback()
		a.tx = nil
	}
}

// put records a change of this batch; value nil deletes. The applier
// keeps value: the caller must not change it afterwards.
func (a *applier) put(bucket, key, value []byte) { a.putKey(bucket, string(key), value) }

// putKey is put for a key the caller holds as a string.
func (a *applier) putKey(bucket []byte, k string, value []byte) {
	m := a.batch[string(bucket)]
	if m == nil {
		m = map[string][]byte{}
		a.batch[string(bucket)] = m
	}
	n := len(m)
	m[k] = value
	if len(m) > n { // a key this batch had not changed yet
		a.batchOrder[string(bucket)] = append(a.batchOrder[string(bucket)], k)
	}
}

// requestChangesKeptMax bounds the request changes map kept for the next
// batch: ranging over a map costs its capacity, not its length, so a map
// grown by a purge of thousands of ids is dropped, not cleared.
const requestChangesKeptMax = 1024

// spareRequestChanges returns the empty map the last batch left for the
// request changes of this one, or a new one. A batch of takes fills it
// with an id a take, and growing a new map every batch cost 3.7 KB a batch
// of 24. The apply goroutine calls it, holding applyMu.
func (l *Ledger) spareRequestChanges() map[string]requestChange {
	if m := l.requestChangesSpare; m != nil {
		l.requestChangesSpare = nil
		return m
	}
	return map[string]requestChange{}
}

// keepRequestChanges keeps a batch's request changes map, emptied, for
// the next batch once the mirrors have taken its changes.
func (l *Ledger) keepRequestChanges(m map[string]requestChange) {
	if len(m) <= requestChangesKeptMax {
		clear(m)
		l.requestChangesSpare = m
	}
}

// prunedKeptMax bounds the pruned-id list kept from one batch for the
// next: 24 bytes an entry, 12 MiB in all. Past the request cap, a prune a
// second forgets a second's new ids (250,000 at the batch route's rate),
// and growing that list anew in every prune cost 2.4 % of a batch
// deduct's CPU (`BenchmarkLedger_TakeBatches` with a CPU profile shows
// it).
const prunedKeptMax = 1 << 19

// sparePruned returns the empty pruned-id list the last prune left, or
// nil. The apply goroutine calls it, holding applyMu.
func (l *Ledger) sparePruned() []prunedRequest {
	s := l.prunedSpare
	l.prunedSpare = nil
	return s
}

// keepPruned keeps a batch's pruned-id list, emptied, for the next prune.
func (l *Ledger) keepPruned(s []prunedRequest) {
	if cap(s) == 0 || cap(s) > prunedKeptMax {
		return
	}
	clear(s) // let the ids' strings go
	l.prunedSpare = s[:0]
}

// updateMirrors applies a committed batch's changes to the mirrors. The
// caller holds l.mu.
func (a *applier) updateMirrors() {
	l := a.ledger
	// Removals first: an id pruned and then sold again in this batch is
	// added back by requestChanges.
	for _, p := range a.prunedRequests {
		l.requests.Remove(p.request, p.at)
	}
	adds := l.addsSpare[:0]
	for req, ch := range a.requestChanges {
		if ch.order == "" {
			l.requests.Remove(req, ch.at)
		} else {
			adds = append(adds, requestindex.Entry{ID: req, At: ch.at})
		}
	}
	l.requests.AddAll(adds)
	if cap(adds) <= requestChangesKeptMax {
		clear(adds) // let the ids' strings go
		l.addsSpare = adds[:0]
	}
	for id, at := range a.holdChanges {
		if at < 0 {
			delete(l.holds, id)
		} else {
			l.holds[id] = at
		}
	}
	for key, n := range a.boughtChanges {
		if n == 0 {
			delete(l.bought, key)
		} else {
			l.bought[key] = n
			l.buyerFilter.Load().Add(maphash.String(l.reqSeed, key))
		}
	}
	if l.requests.RebuildFilterIfFull() {
		l.reqFilter.Store(l.requests.Filter())
	}
	l.legacyRequests.Store(l.requests.HoldsLegacy())
	for node, addr := range a.nodeChanges {
		l.nodes[node] = addr
	}
}

func (a *applier) sku(name string) *stock.SKU {
	if s, ok := a.touched[name]; ok {
		return s
	}
	a.ledger.mu.RLock()
	s, ok := a.ledger.skus[name]
	a.ledger.mu.RUnlock()
	if !ok {
		return nil
	}
	c := s.Clone()
	a.touched[name] = c
	if c.Queue != nil {
		a.queued = append(a.queued, c)
	}
	return c
}

func (a *applier) event(e Event) {
	e.Index = a.index
	a.events = append(a.events, e)
}

func (a *applier) apply(c command.Command) (*command.Result, error) {
	switch c := c.(type) {
	case *command.CreateSale:
		return a.createSale(c), nil
	case *command.Restock:
		return a.restock(c)
	case *command.Lease:
		return a.lease(c), nil
	case *command.Return:
		return a.giveBack(c), nil
	case *command.Take:
		return a.take(c)
	case *command.Confirm:
		return a.confirm(c)
	case *command.Release:
		return a.release(c)
	case *command.Reclaim:
		return a.reclaim(c), nil
	case *command.Register:
		return a.register(c)
	case *command.Expire:
		return a.expire(c)
	case *command.PruneRequests:
		return a.pruneRequests(c)
	case *command.AckConsumer:
		return a.ackConsumer(c)
	case *command.PruneEvents:
		return a.pruneEvents(c)
	case *command.CloseSale:
		return a.closeSale(c), nil
	case *command.ArchiveSale:
		return a.archiveSale(c), nil
	case *command.PurgeArchived:
		return a.purgeArchived(c)
	case *command.PurgeOrders:
		return a.purgeOrders(c)
	case *command.Enter:
		return a.enter(c)
	case *command.Draw:
		return a.draw(c)
	case *command.SetRules:
		return a.setRules(c), nil
	case *command.Join, *command.QueueTick, *command.RotateQueueKey:
		return waitroom.Apply(queueTxn{a}, c, a.sku)
	}
	return &command.Result{Outcome: stock.OutcomeInvalid, Detail: fmt.Sprintf("unknown command %T", c)}, nil
}

func invalid(format string, args ...any) *command.Result {
	return &command.Result{Outcome: stock.OutcomeInvalid, Detail: fmt.Sprintf(format, args...)}
}

func (a *applier) restock(c *command.Restock) (*command.Result, error) {
	if c.Qty <= 0 {
		return invalid("restock qty %d <= 0", c.Qty), nil
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}, nil
	}
	if s.Closed() {
		return &command.Result{Outcome: stock.OutcomeClosed}, nil
	}
	if s.Lottery != nil && s.Lottery.WaitlistLostAtUnixNano != 0 {
		return &command.Result{Outcome: stock.OutcomeLottery, Detail: "the lottery's waitlist has lost: nobody could win the units"}, nil
	}
	s.Total += c.Qty
	s.Available += c.Qty
	a.event(Event{Kind: EventStockChanged, SKU: c.SKU, Qty: c.Qty})
	if err := a.settleWaitlist(s); err != nil {
		return nil, err
	}
	return &command.Result{Outcome: stock.OutcomeOK, Qty: c.Qty}, nil
}

func (a *applier) lease(c *command.Lease) *command.Result {
	if c.Node == "" || c.Want <= 0 {
		return invalid("lease needs a node and want > 0")
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}
	}
	if s.Closed() {
		return &command.Result{Outcome: stock.OutcomeClosed}
	}
	if s.Lottery != nil {
		return &command.Result{Outcome: stock.OutcomeLottery, Detail: "a lottery's units go to its draw, not to leases"}
	}
	grant := min(c.Want, s.Available)
	if short := c.Want - grant; short > 0 && s.LeasedTotal()-s.Leased[c.Node] > 0 {
		// Others hold units this node's buyers are waiting for: tell the
		// holders, who give part of their lease back.
		a.event(Event{Kind: EventLeaseWanted, Node: c.Node, SKU: c.SKU, Qty: short})
	}
	if grant > 0 {
		s.Available -= grant
		if s.Leased == nil {
			s.Leased = make(map[string]int64)
		}
		s.Leased[c.Node] += grant
		a.event(Event{Kind: EventLeaseGranted, Node: c.Node, SKU: c.SKU, Qty: grant})
	}
	return &command.Result{Outcome: stock.OutcomeOK, Qty: grant}
}

func (a *applier) giveBack(c *command.Return) *command.Result {
	if c.Node == "" || c.Qty <= 0 {
		return invalid("return needs a node and qty > 0")
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}
	}
	back := min(c.Qty, s.Leased[c.Node])
	if back > 0 {
		s.Leased[c.Node] -= back
		if s.Leased[c.Node] == 0 {
			delete(s.Leased, c.Node)
		}
		s.Available += back
		a.event(Event{Kind: EventLeaseReturned, Node: c.Node, SKU: c.SKU, Qty: back})
	}
	return &command.Result{Outcome: stock.OutcomeOK, Qty: back}
}

func (a *applier) reclaim(c *command.Reclaim) *command.Result {
	if c.Node == "" {
		return invalid("reclaim needs a node")
	}
	var total int64
	seen := make(map[string]bool)
	a.ledger.mu.RLock()
	for name := range a.ledger.skus {
		seen[name] = true
	}
	a.ledger.mu.RUnlock()
	for name := range a.touched {
		seen[name] = true
	}
	names := slices.Collect(maps.Keys(seen))
	sort.Strings(names) // deterministic order of writes
	for _, name := range names {
		s := a.sku(name)
		if s == nil || s.Leased[c.Node] == 0 {
			continue
		}
		n := s.Leased[c.Node]
		delete(s.Leased, c.Node)
		s.Available += n
		total += n
	}
	a.event(Event{Kind: EventReclaimed, Node: c.Node, Qty: total})
	return &command.Result{Outcome: stock.OutcomeOK, Qty: total}
}

func (a *applier) register(c *command.Register) (*command.Result, error) {
	if c.Node == "" || c.Addr == "" {
		return invalid("register needs a node and an address"), nil
	}
	old, err := a.get(store.BucketNodes, []byte(c.Node))
	if err != nil {
		return nil, err
	}
	if string(old) == c.Addr {
		return &command.Result{Outcome: stock.OutcomeSame}, nil
	}
	a.put(store.BucketNodes, []byte(c.Node), []byte(c.Addr))
	a.nodeChanges[c.Node] = c.Addr
	a.event(Event{Kind: EventNodeRegistered, Node: c.Node})
	return &command.Result{Outcome: stock.OutcomeOK}, nil
}
