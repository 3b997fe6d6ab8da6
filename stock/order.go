package stock

import "fmt"

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
	OutcomeNotQueued         // a join or tick for a sale without a waiting room
	OutcomeSoldOut           // a join of a queued sale that nothing can still be won from
	OutcomeAdmissionRequired // a take from a queued sale without a ticket
	OutcomeAdmissionInvalid  // a take whose ticket is not admitted now (spent, expired, another's)
)

var outcomeNames = [...]string{
	OutcomeOK: "ok", OutcomeSame: "same", OutcomeConflict: "conflict", OutcomeUnknownSKU: "unknown_sku",
	OutcomeLeaseShort: "lease_short", OutcomeUserLimit: "user_limit", OutcomeNotFound: "not_found",
	OutcomeExpired: "expired", OutcomeInvalidState: "invalid_state", OutcomeInvalid: "invalid",
	OutcomeClosed: "closed", OutcomeNotClosed: "not_closed", OutcomeHoldsPending: "holds_pending",
	OutcomeUnconsumed: "unconsumed_events", OutcomeNotLottery: "not_a_lottery",
	OutcomeEntriesClosed: "entries_closed", OutcomeLottery: "lottery_sale",
	OutcomeRequestIDReused: "request_id_reused",
	OutcomeNotQueued:       "not_queued", OutcomeSoldOut: "sold_out",
	OutcomeAdmissionRequired: "admission_required", OutcomeAdmissionInvalid: "admission_invalid",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
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

// Release reasons recorded on released orders.
const (
	ReleaseCancelled = "cancelled"
	ReleaseExpired   = "expired"
)

// Release reasons of takes the ledger turned down: an order a node
// promised (wait=none) that never came to be. No order_created precedes
// such an event.
const (
	ReleaseTurnedDownUserLimit  = "turned_down_user_limit"
	ReleaseTurnedDownLeaseShort = "turned_down_lease_short"
	ReleaseTurnedDownUnknownSKU = "turned_down_unknown_sku"
	ReleaseTurnedDownClosed     = "turned_down_closed"
	// ReleaseTurnedDownRequestIDReused: the buyer's request id named
	// another SKU or qty, or a lottery entry, when the take was applied.
	ReleaseTurnedDownRequestIDReused = "turned_down_request_id_reused"
)
