package raftfsm

import (
	"fmt"
)

// Outcome is the ledger's verdict on a command or on one take entry. Outcomes
// are results, not errors: a sold-out or over-limit take is a normal answer.
type Outcome uint8

// Outcomes returned by Apply.
const (
	OutcomeOK Outcome = iota + 1
	// OutcomeSame: the command repeats one already applied (same sale
	// config, same order id, same request id, confirm of a sold order); the
	// result carries the original.
	OutcomeSame
	OutcomeConflict      // a sale with this SKU exists with another config
	OutcomeUnknownSKU    // no sale with this SKU
	OutcomeLeaseShort    // the taking node's lease does not cover the take
	OutcomeUserLimit     // the buyer would exceed the sale's per_user limit
	OutcomeNotFound      // no order with this id
	OutcomeExpired       // the hold's deadline passed before the confirm
	OutcomeInvalidState  // the order's state does not allow the command
	OutcomeInvalid       // the command itself is malformed
	OutcomeClosed        // the sale is closed
	OutcomeNotClosed     // archive of a sale that is not closed
	OutcomeHoldsPending  // archive of a sale with units still held
	OutcomeUnconsumed    // archive of a sale whose events a consumer has not acknowledged
	OutcomeNotLottery    // an entry or a draw for a sale that is no lottery
	OutcomeEntriesClosed // an entry after the lottery's entries closed (or it was drawn, or is full)
	OutcomeLottery       // a lease or restock the lottery sale does not take
	// OutcomeRequestIDReused: the entry's user already used its request id
	// for another SKU or qty, or for a lottery entry (RulesScopedRequestIDs).
	OutcomeRequestIDReused
)

var outcomeNames = [...]string{
	OutcomeOK: "ok", OutcomeSame: "same", OutcomeConflict: "conflict", OutcomeUnknownSKU: "unknown_sku",
	OutcomeLeaseShort: "lease_short", OutcomeUserLimit: "user_limit", OutcomeNotFound: "not_found",
	OutcomeExpired: "expired", OutcomeInvalidState: "invalid_state", OutcomeInvalid: "invalid",
	OutcomeClosed: "closed", OutcomeNotClosed: "not_closed", OutcomeHoldsPending: "holds_pending",
	OutcomeUnconsumed: "unconsumed_events", OutcomeNotLottery: "not_a_lottery",
	OutcomeEntriesClosed: "entries_closed", OutcomeLottery: "lottery_sale",
	OutcomeRequestIDReused: "request_id_reused",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Result is the ledger's answer to one command, read through
// ApplyFuture.Response on the proposing node. Takes is set for a Take, one
// result per entry in order; Qty is the units granted by a Lease, returned
// by a Return or Reclaim, released by an Expire, forgotten by a prune.
type Result struct {
	Outcome Outcome      `json:"outcome"`
	Qty     int64        `json:"qty,omitempty"`
	Order   *Order       `json:"order,omitempty"`
	Takes   []TakeResult `json:"takes,omitempty"`
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
	Outcome Outcome `json:"outcome"`
	Order   Order   `json:"order"`
}

// OrderState is the life cycle of an order.
type OrderState string

// Order states. pending exists only on a node before commit.
const (
	OrderPending  OrderState = "pending"
	OrderHeld     OrderState = "held"
	OrderSold     OrderState = "sold"
	OrderReleased OrderState = "released"
)

// Order is one accepted take as the ledger records it.
type Order struct {
	ID                string     `json:"order_id"`
	SKU               string     `json:"sku"`
	User              string     `json:"user"`
	Qty               int64      `json:"qty"`
	State             OrderState `json:"state"`
	RequestID         string     `json:"request_id,omitempty"`
	Node              string     `json:"node"`
	CreatedAtUnixNano int64      `json:"created_at"`
	ExpiresAtUnixNano int64      `json:"expires_at,omitempty"`
	ReleaseReason     string     `json:"release_reason,omitempty"`
}
