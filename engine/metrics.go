package engine

import (
	"maps"
	"stockd.dev/stockd/internal/counter"
	"sync"
	"sync/atomic"
	"time"
)

// counterShards spreads hot counters over cache lines by the deduct's hint,
// so that counting does not bring back the shared cache line the buckets
// avoid.
const counterShards = 8

// Metrics are the engine's counters. Reads may run concurrently with the
// engine; each figure is read atomically, not the set as a whole.
type Metrics struct {
	deducts [statusCount][counterShards]counter.Uint64

	takeBatchSizes   [len(batchSizeBounds) + 1]atomic.Uint64
	commitTimes      [len(commitSecondsBounds) + 1]atomic.Uint64
	commitNanos      atomic.Uint64 // sum of the commit times counted
	takeBatches      atomic.Uint64
	takeBatchEntries atomic.Uint64
	takeRetries      atomic.Uint64
	leaseGranted     atomic.Uint64
	leaseErrors      atomic.Uint64
	leaseShort       atomic.Uint64
	leaseReturned    atomic.Uint64
	leaseReclaimed   atomic.Uint64
	leaseGivenBack   atomic.Uint64 // units returned because another node wanted them
	takeSplits       atomic.Uint64 // batches the leader refused as too large or malformed, split
	holdsExpired     atomic.Uint64
	entries          atomic.Uint64 // lottery entries answered (new or repeated) after a commit
	feedUnreadPruned atomic.Uint64 // feed events pruned at the cap before a consumer acknowledged them
	feedAtCap        atomic.Bool   // the last prune cut into a consumer's unacknowledged events
	catchUps         atomic.Uint64 // misses that caught up with the leader before answering
	catchUpRounds    atomic.Uint64 // read indexes asked for them
	tokensRefused    [len(TokenRefusals)]atomic.Uint64

	driftMu sync.Mutex
	drift   map[string]int64 // sku -> units of drift found by the last audit
	// auditNanos is how long the last periodic audit took (it paces the
	// next: the janitor).
	auditNanos atomic.Int64
}

// Answered is how many deducts (of every outcome) and lottery entries
// the node has answered: how busy it is selling (the periodic audit waits
// while it is: auditDue).
func (m *Metrics) Answered() uint64 {
	n := m.entries.Load()
	for s := range m.deducts {
		for i := range m.deducts[s] {
			n += m.deducts[s][i].Load()
		}
	}
	return n
}

// SetDrift records the units the last audit of sku found off.
func (m *Metrics) SetDrift(sku string, units int64) {
	m.driftMu.Lock()
	if m.drift == nil {
		m.drift = map[string]int64{}
	}
	m.drift[sku] = units
	m.driftMu.Unlock()
}

func newMetrics() *Metrics { return &Metrics{} }

// TokenRefusals name why a queued sale's deduct was refused its
// admission: TokensRefused counts them in this order.
var TokenRefusals = [...]string{"missing", "malformed", "forged", "expired", "key_rotated_out"}

func (m *Metrics) countTokenRefused(reason string) {
	for i, r := range TokenRefusals {
		if r == reason {
			m.tokensRefused[i].Add(1)
		}
	}
}

// TokensRefused reads the refusals by reason (TokenRefusals' order).
func (m *Metrics) TokensRefused() (out [len(TokenRefusals)]uint64) {
	for i := range out {
		out[i] = m.tokensRefused[i].Load()
	}
	return out
}

// batchSizeBounds are the upper bounds of the Take batch size histogram.
var batchSizeBounds = [...]float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}

func (m *Metrics) countBatch(entries int) {
	m.takeBatches.Add(1)
	m.takeBatchEntries.Add(uint64(entries))
	m.takeBatchSizes[counter.Bucket(batchSizeBounds[:], float64(entries))].Add(1)
}

// commitSecondsBounds are the upper bounds of the histogram of a Take
// batch's commit time: from its proposal (local or forwarded) to the
// ledger's verdict.
var commitSecondsBounds = [...]float64{0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1}

func (m *Metrics) countCommit(d time.Duration) {
	m.commitNanos.Add(uint64(max(d, 0)))
	m.commitTimes[counter.Bucket(commitSecondsBounds[:], d.Seconds())].Add(1)
}

func (m *Metrics) countDeduct(s Status, hint uint32) {
	m.deducts[s][hint%counterShards].Add(1)
}

// Deducts returns the number of deducts that ended with status s.
func (m *Metrics) Deducts(s Status) uint64 {
	var n uint64
	for i := range m.deducts[s] {
		n += m.deducts[s][i].Load()
	}
	return n
}

// Snapshot is a copy of the counters for exposition.
type Snapshot struct {
	DeductsByStatus  map[string]uint64
	TakeBatches      uint64
	TakeBatchEntries uint64
	TakeRetries      uint64
	LeaseGranted     uint64
	LeaseErrors      uint64
	LeaseShort       uint64
	CatchUps         uint64
	CatchUpRounds    uint64
	LeaseReturned    uint64
	LeaseReclaimed   uint64
	LeaseGivenBack   uint64
	TakeSplits       uint64
	CommitBlocked    bool
	HoldsExpired     uint64
	LotteryEntries   uint64
	TokensRefused    [len(TokenRefusals)]uint64 // queued sales' deducts refused admission, by reason
	// FeedUnreadPruned counts feed events pruned at the cap before a
	// consumer acknowledged them; FeedAtCap: the last prune did so.
	// AdmissionLimit bounds the deducts won and waiting for the ledger
	// (AdmissionInPath) when AdmissionAdaptive.
	AdmissionLimit    int64
	AdmissionInPath   int64
	AdmissionAdaptive bool
	LedgerFileBytes   int64
	FeedUnreadPruned  uint64
	FeedAtCap         bool
	AuditDrift        map[string]int64 // units, per sku, from the last periodic audit
	AuditSeconds      float64          // how long the last periodic audit took
	PeersUnreachable  int              // on the leader, the voters it fails to heartbeat
	BatchSizeBounds   []float64
	BatchSizeCounts   []uint64 // per bucket of BatchSizeBounds, then +Inf
	// CommitBounds and CommitCounts: Take batches by the time from their
	// proposal to the ledger's verdict, in seconds; CommitSeconds is the sum.
	CommitBounds  []float64
	CommitCounts  []uint64
	CommitSeconds float64

	ProposalsInFlight int
	TakeQueueLength   int
	BucketUnits       map[string]int64 // units in this node's buckets, per sku
	// LedgerPersistLagEntries and LedgerPendingChanges: how far ledger.db
	// is behind the applied state (write-behind), in log entries and in
	// changes waiting.
	LedgerPersistLagEntries uint64
	// LedgerPersistFailures counts failed writes of ledger.db (a full or
	// failing disk).
	LedgerPersistFailures uint64
	LedgerPendingChanges  int
	// Tails are each sale's tail on this node: its first sold_out answer
	// since stock last came back, and its last committed win.
	Tails map[string]SaleTail
}

// MetricsSnapshot copies the counters and reads the engine's gauges.
func (e *Engine) MetricsSnapshot() Snapshot {
	s := e.metrics.snapshot()
	s.ProposalsInFlight = len(e.localSlots) + len(e.forwardSlots)
	s.TakeQueueLength = len(e.takeQueue)
	s.LedgerPersistLagEntries, s.LedgerPendingChanges = e.ledger.PersistLag()
	s.LedgerPersistFailures = e.ledger.PersistFailures()
	s.LedgerFileBytes = e.ledger.FileBytes()
	s.AdmissionLimit, s.AdmissionInPath = e.adaptive.Limit(), e.adaptive.InPath()
	s.AdmissionAdaptive = e.adaptive.On()
	s.CommitBlocked = e.commitBlocked.Load()
	if e.cfg.Cluster != nil {
		s.PeersUnreachable = len(e.cfg.Cluster.Unreachable())
	}
	sales := *e.sales.Load()
	s.BucketUnits = make(map[string]int64, len(sales))
	s.Tails = make(map[string]SaleTail, len(sales))
	for sku, sl := range sales {
		s.BucketUnits[sku] = sl.buckets.Units()
		t := SaleTail{}
		if ns := sl.firstSoldOutNanos.Load(); ns != 0 {
			t.FirstSoldOut = time.Unix(0, ns)
		}
		if ns := sl.lastWinNanos.Load(); ns != 0 {
			t.LastWin = time.Unix(0, ns)
		}
		s.Tails[sku] = t
	}
	return s
}

func (m *Metrics) snapshot() Snapshot {
	s := Snapshot{
		DeductsByStatus:  make(map[string]uint64, statusCount),
		TakeBatches:      m.takeBatches.Load(),
		TakeBatchEntries: m.takeBatchEntries.Load(),
		TakeRetries:      m.takeRetries.Load(),
		LeaseGranted:     m.leaseGranted.Load(),
		LeaseErrors:      m.leaseErrors.Load(),
		LeaseShort:       m.leaseShort.Load(),
		CatchUps:         m.catchUps.Load(),
		CatchUpRounds:    m.catchUpRounds.Load(),
		LeaseReturned:    m.leaseReturned.Load(),
		LeaseReclaimed:   m.leaseReclaimed.Load(),
		LeaseGivenBack:   m.leaseGivenBack.Load(),
		TakeSplits:       m.takeSplits.Load(),
		HoldsExpired:     m.holdsExpired.Load(),
		LotteryEntries:   m.entries.Load(),
		TokensRefused:    m.TokensRefused(),
		FeedUnreadPruned: m.feedUnreadPruned.Load(),
		FeedAtCap:        m.feedAtCap.Load(),
		BatchSizeBounds:  batchSizeBounds[:],
		BatchSizeCounts:  make([]uint64, len(m.takeBatchSizes)),
		CommitBounds:     commitSecondsBounds[:],
		CommitCounts:     make([]uint64, len(m.commitTimes)),
		CommitSeconds:    time.Duration(m.commitNanos.Load()).Seconds(),
	}
	for i := range m.commitTimes {
		s.CommitCounts[i] = m.commitTimes[i].Load()
	}
	s.AuditSeconds = time.Duration(m.auditNanos.Load()).Seconds()
	m.driftMu.Lock()
	s.AuditDrift = maps.Clone(m.drift)
	m.driftMu.Unlock()
	for i := range m.takeBatchSizes {
		s.BatchSizeCounts[i] = m.takeBatchSizes[i].Load()
	}
	for st := Status(1); int(st) < statusCount; st++ {
		s.DeductsByStatus[st.String()] = m.Deducts(st)
	}
	return s
}

// SaleTail is a sale's tail on one node (docs/architecture.md, "True answers at the
// end of a sale"): from its first sold_out answer to its last win.
type SaleTail struct {
	FirstSoldOut time.Time // zero: no sold_out answer since stock last came back
	LastWin      time.Time // zero: no win yet
}

// Length is the time from the first sold_out answer to the last win, 0
// when the last win came before it or either is missing.
func (t SaleTail) Length() time.Duration {
	if t.FirstSoldOut.IsZero() || t.LastWin.IsZero() {
		return 0
	}
	return max(t.LastWin.Sub(t.FirstSoldOut), 0)
}

// CountEntries counts lottery entries answered after a commit.
func (m *Metrics) CountEntries(n uint64) { m.entries.Add(n) }

// NoteFeedPrune records a prune of the order feed: whether it cut into a
// consumer's unacknowledged events (atCap), and how many it pruned so.
func (m *Metrics) NoteFeedPrune(atCap bool, unread uint64) {
	m.feedAtCap.Store(atCap)
	m.feedUnreadPruned.Add(unread)
}

// NoteAudit records how long the last periodic audit took (it paces the
// next); AuditNanos reads it.
func (m *Metrics) NoteAudit(d time.Duration) { m.auditNanos.Store(int64(d)) }

// AuditNanos is how long the last periodic audit took.
func (m *Metrics) AuditNanos() int64 { return m.auditNanos.Load() }
