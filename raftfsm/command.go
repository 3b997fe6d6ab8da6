package raftfsm

import (
	"encoding/json"
	"fmt"
)

// Op names a ledger command.
type Op uint8

// The ledger commands of DESIGN.md. Values are part of the log format: append,
// never renumber.
const (
	OpCreateSale Op = iota + 1
	OpRestock
	OpLease
	OpReturn
	OpTake
	OpConfirm
	OpRelease
	OpReclaim
	OpRegister
	OpExpire
	OpPruneRequests
)

var opNames = [...]string{
	OpCreateSale: "create_sale", OpRestock: "restock", OpLease: "lease", OpReturn: "return",
	OpTake: "take", OpConfirm: "confirm", OpRelease: "release", OpReclaim: "reclaim",
	OpRegister: "register", OpExpire: "expire", OpPruneRequests: "prune_requests",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Command is one entry of the replicated log. AtUnixNano is the proposer's
// clock: Apply never reads a clock of its own, so every node computes the same
// deadlines from the same log.
type Command struct {
	Op         Op          `json:"op"`
	AtUnixNano int64       `json:"at"`
	Node       string      `json:"node,omitempty"`
	SKU        string      `json:"sku,omitempty"`
	Qty        int64       `json:"qty,omitempty"`
	Sale       *SaleConfig `json:"sale,omitempty"`
	Takes      []TakeEntry `json:"takes,omitempty"`
	OrderID    string      `json:"order,omitempty"`
	Reason     string      `json:"reason,omitempty"`
	Addr       string      `json:"addr,omitempty"` // Register: the node's HTTP address
	// Expire: the held orders to release if their deadline has passed at
	// AtUnixNano.
	OrderIDs []string `json:"orders,omitempty"`
	// PruneRequests: forget request ids whose order was created before
	// BeforeUnixNano, and the oldest beyond MaxKeep.
	BeforeUnixNano int64 `json:"before,omitempty"`
	MaxKeep        int64 `json:"max_keep,omitempty"`
}

// SaleConfig is what an operator sets when creating a sale.
type SaleConfig struct {
	Total           int64 `json:"total"`
	StartAtUnixNano int64 `json:"start_at,omitempty"`
	PerUser         int64 `json:"per_user,omitempty"`
	HoldTTLNanos    int64 `json:"hold_ttl,omitempty"`
}

// TakeEntry is one won deduct inside a Take batch. OrderID is minted by the
// taking node; the ledger ignores an entry whose order id it already holds,
// so a batch may be proposed again after an unknown outcome.
type TakeEntry struct {
	SKU       string `json:"sku"`
	Qty       int64  `json:"qty"`
	User      string `json:"user"`
	RequestID string `json:"req,omitempty"`
	OrderID   string `json:"order"`
}

// Encode serialises a command for raft.Apply.
func (c *Command) Encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", c.Op, err)
	}
	return b, nil
}

// DecodeCommand parses a log entry written by Encode.
func DecodeCommand(b []byte) (Command, error) {
	var c Command
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("decode command: %w", err)
	}
	return c, nil
}

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
	OutcomeConflict     // a sale with this SKU exists with another config
	OutcomeUnknownSKU   // no sale with this SKU
	OutcomeLeaseShort   // the taking node's lease does not cover the take
	OutcomeUserLimit    // the buyer would exceed the sale's per_user limit
	OutcomeNotFound     // no order with this id
	OutcomeExpired      // the hold's deadline passed before the confirm
	OutcomeInvalidState // the order's state does not allow the command
	OutcomeInvalid      // the command itself is malformed
)

var outcomeNames = [...]string{
	OutcomeOK: "ok", OutcomeSame: "same", OutcomeConflict: "conflict", OutcomeUnknownSKU: "unknown_sku",
	OutcomeLeaseShort: "lease_short", OutcomeUserLimit: "user_limit", OutcomeNotFound: "not_found",
	OutcomeExpired: "expired", OutcomeInvalidState: "invalid_state", OutcomeInvalid: "invalid",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Result is the ledger's answer to one command, read through
// ApplyFuture.Response on the proposing node. Takes is set for OpTake, one
// result per entry in order; Qty is the units granted by a Lease, returned by
// a Return or Reclaim.
type Result struct {
	Outcome Outcome      `json:"outcome"`
	Qty     int64        `json:"qty,omitempty"`
	Order   *Order       `json:"order,omitempty"`
	Takes   []TakeResult `json:"takes,omitempty"`
	Detail  string       `json:"detail,omitempty"`
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

// Order states of DESIGN.md. pending exists only on a node before commit.
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
