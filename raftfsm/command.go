package raftfsm

import "stockd/stock"

// Result is the ledger's answer to one command, read through
// ApplyFuture.Response on the proposing node. Takes is set for a Take, one
// result per entry in order; Qty is the units granted by a Lease, returned
// by a Return or Reclaim, released by an Expire, forgotten by a prune.
type Result struct {
	Outcome stock.Outcome `json:"outcome"`
	Qty     int64         `json:"qty,omitempty"`
	Order   *stock.Order  `json:"order,omitempty"`
	Takes   []TakeResult  `json:"takes,omitempty"`
	// Entries is set for an Enter, one result per entry in order.
	Entries []EntryResult `json:"entries,omitempty"`
	Detail  string        `json:"detail,omitempty"`
	// Index is the log index the command was applied at, set by the
	// proposing node; a follower that forwarded the command waits until it
	// has applied this index itself before it answers.
	Index uint64 `json:"index"`
}

// TakeResult is the verdict on one TakeEntry. Order is set for OutcomeOK and
// OutcomeSame (the order the entry's order id or request id already names).
type TakeResult struct {
	Outcome stock.Outcome `json:"outcome"`
	Order   stock.Order   `json:"order"`
}
