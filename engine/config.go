package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/shard"
)

// Errors of the engine's control-plane calls. Deduct reports its outcomes as
// a Status instead.
var (
	ErrUnknownSKU   = errors.New("unknown sku")
	ErrConflict     = errors.New("sale exists with another config")
	ErrInvalid      = errors.New("invalid request")
	ErrClosed       = errors.New("engine closed")
	ErrNotFound     = errors.New("not found")
	ErrForbidden    = errors.New("forbidden")
	ErrExpired      = errors.New("hold expired")
	ErrInvalidState = errors.New("order state does not allow this")
	ErrTooManySKUs  = errors.New("too many skus")
	// ErrCursorExpired: the feed's events after the cursor were pruned.
	ErrCursorExpired = errors.New("cursor older than the feed's retention")
	// ErrBadCursor: the cursor names no event of the feed.
	ErrBadCursor = errors.New("bad cursor")
	// ErrSaleClosed: the sale was closed.
	ErrSaleClosed = errors.New("sale closed")
	// Archive refusals: the sale is open, has held units, or has events a
	// consumer of the order feed has not acknowledged.
	ErrNotClosed    = errors.New("sale not closed")
	ErrHoldsPending = errors.New("units still held")
	ErrUnconsumed   = errors.New("events not acknowledged by every consumer")
	// ErrUnavailable: the ledger could not take the command (no leader, no
	// quorum, shutting down); nothing was applied.
	ErrUnavailable = errors.New("ledger unavailable")
	// ErrOutcomeUnknown: the command may or may not have been applied.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrTooLarge: the leader refused the command for its size; nothing
	// was applied, and the same bytes would be refused again (split them).
	ErrTooLarge = errors.New("command too large")
	// ErrRejected: the leader refused the command as malformed or not
	// allowed; nothing was applied, and sending it again cannot help.
	ErrRejected = errors.New("command rejected")
	// ErrDrainIncomplete: Close gave up on takes that could not commit in
	// time (no quorum, or the drain deadline). Their units stay leased to
	// this node, which loads them again at its next start.
	ErrDrainIncomplete = errors.New("drain incomplete")
)

// Limits, each with its reason.
const (
	// MaxQtyPerDeduct bounds one deduct: a flash sale sells a few units per
	// buyer, and a huge qty is a client bug, not a purchase.
	MaxQtyPerDeduct = 1000
	// MaxSKUs bounds the sales one node tracks (each holds buckets and a
	// goroutine-free lease state; the ledger row is small).
	MaxSKUs = 100_000
	// maxTakeBatchEntries bounds the takes of one batch (and so the
	// buyers one commit answers).
	maxTakeBatchEntries = 4096
	// stockPollInterval paces a waiting deduct's re-reads of the ledger.
	stockPollInterval = 5 * time.Millisecond
	// tryAgainAfter is the Retry-After of a try_again answer.
	tryAgainAfter = time.Second
	// applyWaitMax bounds how long a settled batch waits for this node to
	// apply it before its bookkeeping ends anyway.
	applyWaitMax = 5 * time.Second
	// drainLeaderlessMax is how long Close waits for queued takes while no
	// leader is reachable.
	drainLeaderlessMax = time.Second
	// demandPace spaces a node's demand leases for one sale while the
	// ledger has nothing available: holders need a round trip to answer.
	demandPace = 10 * time.Millisecond
	// leaseRetryBackoff spaces lease proposals that failed (no leader yet).
	leaseRetryBackoff = 20 * time.Millisecond
	// takeRetryBackoff spaces re-proposals of takes whose outcome is unknown.
	takeRetryBackoff = 20 * time.Millisecond
)

// Proposer replicates a command and returns the ledger's result once it is
// applied. It may be called from several goroutines at once. node's
// Proposer proposes to raft on the leader and forwards from a follower.
//
// Errors are the engine's sentinels: ErrUnavailable (nothing applied; may
// be retried), ErrOutcomeUnknown (retry with the same order ids),
// ErrTooLarge and ErrRejected (nothing applied; never send the same command
// again). Any other error is taken as ErrOutcomeUnknown. node's Proposer
// maps raft's errors onto these, once.
type Proposer interface {
	Propose(atUnixNano int64, c command.Command) (*command.Result, error)
}

// Config holds the engine's knobs. Logger and NodeID are required.
type Config struct {
	NodeID string
	Logger *slog.Logger

	// BucketsPerSKU is the number of per-core counters per sale.
	BucketsPerSKU int
	// LeaseChunkMax caps one lease; chunks shrink toward 1 as the ledger's
	// available shrinks (available / LeaseDivisor).
	LeaseChunkMax int64
	LeaseDivisor  int64
	// LeaseWait is how long a deduct that finds the buckets empty waits for
	// a lease refill before answering.
	LeaseWait time.Duration
	// CommitWait is how long a wait=commit deduct waits for its batch to be
	// applied before it answers outcome_unknown.
	CommitWait time.Duration
	// ProposalsInFlightMax bounds Take proposals in flight while this node
	// leads; takes queue while all are busy and leave in the next batch.
	// One is fastest on a 2-core machine (bigger batches, less per-batch
	// CPU). ForwardedInFlightMax bounds them while the leader is another
	// node. One is fastest there too: every raft entry costs an fsync and
	// an apply on each of the three nodes, so a few large forwarded
	// batches beat many small ones (docs/architecture.md, "Choices made
	// on the way").
	ProposalsInFlightMax int
	ForwardedInFlightMax int
	// ForwardLinger lets a following node's Take batch wait up to this
	// long for more takes before it is forwarded (0: send at once). Each
	// forwarded batch is a raft entry that every node fsyncs and applies.
	ForwardLinger time.Duration
	// ProposeLinger is ForwardLinger for the leader's own Take batches,
	// in a cluster only: a node alone proposes at once.
	ProposeLinger time.Duration
	// TakeBatchBytesMax bounds one Take batch's encoded size, well under
	// raft's suggested 512 KiB per entry and the internal wire's cap.
	TakeBatchBytesMax int
	// TakeQueueMax bounds won takes waiting for a proposal slot.
	TakeQueueMax int
	// LeaseIdleReturn: a sale's unused lease goes back to the ledger when
	// no unit was taken from this node's buckets for this long, so stock
	// never sits stranded here while another node turns buyers away.
	LeaseIdleReturn time.Duration
	// ReclaimAfter: the leader reclaims the leases of a peer it has not
	// reached for this long (and at once of a node no longer a member).
	ReclaimAfter time.Duration
	// RequestRetention and RequestMaxKeep bound the request ids the ledger
	// remembers for idempotency: the leader prunes ids older than the
	// retention, and the oldest beyond the count.
	RequestRetention time.Duration
	RequestMaxKeep   int64
	// AuditInterval paces the periodic self-audit of every sale.
	AuditInterval time.Duration
	// The order feed's retention, which the leader enforces every
	// FeedPruneInterval: events are kept for FeedRetention and until every
	// consumer has acknowledged them, but never more than FeedCap events
	// (the oldest beyond it go even if a consumer has not read them, with
	// a warning).
	FeedRetention     time.Duration
	FeedCap           uint64
	FeedPruneInterval time.Duration
	// RateLimit caps deducts per second on this node (0: no cap), with
	// RateBurst of headroom; MaxInFlight caps deducts being served at once
	// (0: no cap). Both answer 429 with a retry time; sold-out and
	// not-started answers come before them and are never limited.
	RateLimit   float64
	RateBurst   int
	MaxInFlight int
	// AdmissionLatency turns on admission that follows the ledger: won
	// deducts waiting for their commit are bounded, and the bound shrinks
	// when they wait longer than this (0: off; MaxInFlight, or 10,000,
	// is then the bound's ceiling).
	AdmissionLatency time.Duration
	// AdvertiseHTTP is this node's HTTP address as peers reach it; the
	// engine registers it in the ledger so followers can forward to it.
	AdvertiseHTTP string
	// Cluster tells the engine about raft; nil for a node without peers
	// in tests (always healthy, never leader duties).
	Cluster Cluster
	// Now is the clock; tests replace it.
	Now func() time.Time
}

// Cluster is the engine's view of raft. Its methods may be called from any
// goroutine and must return quickly.
type Cluster interface {
	// IsLeader reports whether this node leads now.
	IsLeader() bool
	// CommitHealthy reports whether a proposal could commit now: a leader
	// is known and this node is in contact with it.
	CommitHealthy() bool
	// Unreachable returns, on the leader, peers it cannot heartbeat, with
	// their last contact.
	Unreachable() map[string]time.Time
	// MemberIDs returns the voters' ids.
	MemberIDs() ([]string, error)
	// VotersKnowRules reports whether every voter runs a binary that
	// applies ledger rules (raftfsm.Rules*) at least this new. It may ask
	// the other voters over the network: the janitor calls it, on the
	// leader, until the ledger runs its binary's rules.
	VotersKnowRules(rules uint64) bool
	// ReadIndex returns a log index every write the cluster acknowledged
	// before the call has reached; it may ask the leader over the network.
	// A node that has applied it may answer "there is no such thing".
	ReadIndex(ctx context.Context) (uint64, error)
	// LeaseReadIndex is ReadIndex on the leader's lease instead of a
	// quorum round (vouch.go).
	LeaseReadIndex(ctx context.Context) (uint64, error)
}

// DefaultConfig returns the knobs for node id n1.
func DefaultConfig() Config {
	return Config{
		NodeID:               "n1",
		BucketsPerSKU:        runtime.GOMAXPROCS(0),
		LeaseChunkMax:        1024,
		LeaseDivisor:         4,
		LeaseWait:            2 * time.Second,
		CommitWait:           5 * time.Second,
		ProposalsInFlightMax: 1,
		ForwardedInFlightMax: 1,
		ForwardLinger:        time.Millisecond,
		ProposeLinger:        time.Millisecond,
		TakeBatchBytesMax:    256 << 10,
		TakeQueueMax:         1 << 16,
		LeaseIdleReturn:      time.Second,
		ReclaimAfter:         10 * time.Second,
		RequestRetention:     24 * time.Hour,
		RequestMaxKeep:       1_000_000,
		AuditInterval:        30 * time.Second,
		FeedRetention:        24 * time.Hour,
		FeedCap:              10_000_000,
		FeedPruneInterval:    10 * time.Second,
		RateBurst:            1000,
		MaxInFlight:          10_000,
		AdmissionLatency:     2 * time.Second,
		Now:                  time.Now,
	}
}

// Validate names the first knob that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("engine: node id is empty")
	case c.BucketsPerSKU < 1 || c.BucketsPerSKU > shard.MaxBuckets:
		return fmt.Errorf("engine: buckets per sku %d outside 1..%d", c.BucketsPerSKU, shard.MaxBuckets)
	case c.LeaseChunkMax < 1:
		return fmt.Errorf("engine: lease chunk max %d < 1", c.LeaseChunkMax)
	case c.LeaseDivisor < 1:
		return fmt.Errorf("engine: lease divisor %d < 1", c.LeaseDivisor)
	case c.LeaseWait <= 0 || c.CommitWait <= 0:
		return fmt.Errorf("engine: lease wait %s and commit wait %s must be > 0", c.LeaseWait, c.CommitWait)
	case c.ProposalsInFlightMax < 1 || c.ForwardedInFlightMax < 1:
		return fmt.Errorf("engine: proposals in flight %d and forwarded in flight %d must be >= 1", c.ProposalsInFlightMax, c.ForwardedInFlightMax)
	case c.TakeBatchBytesMax < 1<<10:
		return fmt.Errorf("engine: take batch bytes max %d < 1 KiB", c.TakeBatchBytesMax)
	case c.TakeQueueMax < 1:
		return fmt.Errorf("engine: take queue max %d < 1", c.TakeQueueMax)
	case c.Now == nil:
		return errors.New("engine: clock is nil")
	case c.LeaseIdleReturn <= 0 || c.ReclaimAfter <= 0:
		return fmt.Errorf("engine: lease idle return %s and reclaim after %s must be > 0", c.LeaseIdleReturn, c.ReclaimAfter)
	case c.RequestRetention <= 0 || c.RequestMaxKeep < 1:
		return fmt.Errorf("engine: request retention %s must be > 0 and request max keep %d >= 1", c.RequestRetention, c.RequestMaxKeep)
	case c.AuditInterval <= 0:
		return fmt.Errorf("engine: audit interval %s must be > 0", c.AuditInterval)
	case c.FeedRetention <= 0 || c.FeedCap < 1 || c.FeedPruneInterval <= 0:
		return fmt.Errorf("engine: event retention %s and prune interval %s must be > 0, event cap %d >= 1", c.FeedRetention, c.FeedPruneInterval, c.FeedCap)
	case c.RateLimit < 0 || c.MaxInFlight < 0 || (c.RateLimit > 0 && c.RateBurst < 1):
		return fmt.Errorf("engine: rate limit %g and max in flight %d must be >= 0, rate burst %d >= 1 with a rate", c.RateLimit, c.MaxInFlight, c.RateBurst)
	}
	return nil
}
