package engine

import (
	"context"
	"sync/atomic"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
)

// Ledger is what the engine, the data plane, reads of the replicated
// ledger, and where it registers for its events, in the roles below (the
// control plane reads the feed, the lottery and the archive's orders
// through its own, control.Ledger). *raftfsm.Ledger implements it; every
// method may be called from any goroutine. The engine writes only through
// a Proposer.
type Ledger interface {
	Rows
	Requests
	Orders
	Progress
	Health
}

// Rows reads sales' rows as applied.
type Rows interface {
	// SKU and SKUs read rows with the applied index.
	SKU(sku string) (stock.SKU, uint64, bool)
	SKUs() ([]stock.SKU, uint64)
	// SKUAvailability is what a waiting buyer needs of a row, uncopied.
	SKUAvailability(sku string) (available, leased int64, closed, ok bool)
}

// Requests answers the deduct path's questions about buyers: what a
// request id produced, and what a buyer bought.
type Requests interface {
	// LookupRequest finds what a user's request id produced (an order,
	// or a lottery entry); MayHoldRequest says, lock-free, whether it may
	// exist at all.
	LookupRequest(user, requestID []byte) (raftfsm.RequestRecord, bool)
	MayHoldRequest(user, requestID []byte) bool
	// RequestLine is a word of what MayHoldRequest reads, for a batch
	// that brings in the lines of many ids before it asks.
	RequestLine(user, requestID []byte) *atomic.Uint64
	// BoughtBytes is a buyer's units of a per_user sale; MayHaveBought
	// says, lock-free, whether they may have any.
	BoughtBytes(sku, user []byte) int64
	MayHaveBought(sku, user []byte) bool
}

// Orders reads orders: one by id, and the holds past their deadline.
type Orders interface {
	Order(id string) (stock.Order, bool, error)
	ExpiredHolds(nowUnixNano int64, limit int) []string
}

// Progress is where the ledger stands in the log: its rules, its applied
// index, the nodes' registered addresses, and its events.
type Progress interface {
	// Rules are the ledger rules it applies entries under now.
	Rules() uint64
	AppliedIndex() uint64
	WaitApplied(ctx context.Context, index uint64) error
	NodeAddrs() map[string]string
	SetObserver(o raftfsm.Observer)
}

// Health is how the ledger's state and its file fare.
type Health interface {
	AuditSKU(sku string) (stock.Audit, bool, error)
	// PersistLag is how far the ledger's file is behind what it applied.
	PersistLag() (entries uint64, changes int)
	// PersistFailures counts failed writes of the ledger's file.
	PersistFailures() uint64
	// FileBytes is the ledger file's size on disk.
	FileBytes() int64
}

var _ Ledger = (*raftfsm.Ledger)(nil)
