package command

import (
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

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
	// Tickets is set for a Join, one result per entry in order.
	Tickets []TicketResult `json:"tickets,omitempty"`
	Detail  string         `json:"detail,omitempty"`
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

// EntryResult is the verdict on one EnterEntry: OutcomeOK (entered) or
// OutcomeSame (the user's entry exists; Entry is it).
type EntryResult struct {
	Outcome stock.Outcome
	Entry   stock.Entry
}

// TicketResult is the verdict on one JoinEntry: OutcomeOK (a new ticket)
// or OutcomeSame (the user's ticket), either with the ticket's join index
// in its sale; the proposing node reads the ticket from its ledger, which
// has applied the Join before it answers.
type TicketResult struct {
	Outcome stock.Outcome
	Joined  int64
}

// resultFormat is the first byte of an encoded Result.
const resultFormat byte = 0xD1

// Result flags say which optional parts follow.
const (
	resultHasOrder byte = 1 << iota
	resultHasTakes
	resultHasEntries
	resultHasTickets
)

// EncodeResult appends r to dst: the answer a leader sends back to a
// follower that forwarded a command.
func EncodeResult(dst []byte, r *Result) []byte {
	var flags byte
	if r.Order != nil {
		flags |= resultHasOrder
	}
	if r.Takes != nil {
		flags |= resultHasTakes
	}
	if r.Entries != nil {
		flags |= resultHasEntries
	}
	if r.Tickets != nil {
		flags |= resultHasTickets
	}
	dst = append(dst, resultFormat, byte(r.Outcome), flags)
	dst = wire.AppendVarint(dst, r.Qty)
	dst = wire.AppendUvarint(dst, r.Index)
	dst = wire.AppendString(dst, r.Detail)
	if r.Order != nil {
		dst = appendOrder(dst, r.Order)
	}
	if r.Takes != nil {
		dst = wire.AppendUvarint(dst, uint64(len(r.Takes)))
		for i := range r.Takes {
			dst = append(dst, byte(r.Takes[i].Outcome))
			dst = appendOrder(dst, &r.Takes[i].Order)
		}
	}
	if r.Entries != nil {
		dst = wire.AppendUvarint(dst, uint64(len(r.Entries)))
		for i := range r.Entries {
			e := &r.Entries[i]
			dst = append(dst, byte(e.Outcome))
			dst = wire.AppendString(wire.AppendString(wire.AppendString(dst, e.Entry.SKU), e.Entry.User), e.Entry.RequestID)
			dst = wire.AppendVarint(wire.AppendVarint(dst, e.Entry.Seq), e.Entry.AtUnixNano)
		}
	}
	if r.Tickets != nil {
		dst = wire.AppendUvarint(dst, uint64(len(r.Tickets)))
		for _, t := range r.Tickets {
			dst = wire.AppendVarint(append(dst, byte(t.Outcome)), t.Joined)
		}
	}
	return dst
}

// DecodeResult parses bytes written by EncodeResult.
func DecodeResult(b []byte) (*Result, error) {
	if len(b) < 3 || b[0] != resultFormat {
		return nil, fmt.Errorf("%w: not a result", wire.ErrMalformed)
	}
	r := &Result{Outcome: stock.Outcome(b[1])}
	flags := b[2]
	d := wire.Decoder{B: b[3:]}
	r.Qty = d.Varint()
	r.Index = d.Uvarint()
	r.Detail = d.String()
	if flags&resultHasOrder != 0 {
		o := decodeOrder(&d)
		r.Order = &o
	}
	if flags&resultHasTakes != 0 {
		r.Takes = make([]TakeResult, d.Count(minOrderBytes+1))
		for i := range r.Takes {
			r.Takes[i].Outcome = stock.Outcome(d.Byte())
			r.Takes[i].Order = decodeOrder(&d)
		}
	}
	if flags&resultHasEntries != 0 {
		r.Entries = make([]EntryResult, d.Count(6))
		for i := range r.Entries {
			e := &r.Entries[i]
			e.Outcome = stock.Outcome(d.Byte())
			e.Entry.SKU, e.Entry.User, e.Entry.RequestID = d.String(), d.String(), d.String()
			e.Entry.Seq, e.Entry.AtUnixNano = d.Varint(), d.Varint()
		}
	}
	if flags&resultHasTickets != 0 {
		r.Tickets = make([]TicketResult, d.Count(2))
		for i := range r.Tickets {
			r.Tickets[i] = TicketResult{Outcome: stock.Outcome(d.Byte()), Joined: d.Varint()}
		}
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	return r, nil
}

// minOrderBytes is the smallest encoded order (empty strings, one-byte
// numbers).
const minOrderBytes = 10

// appendOrder appends o as a result carries it.
func appendOrder(b []byte, o *stock.Order) []byte {
	b = wire.AppendString(b, o.ID)
	b = wire.AppendString(b, o.SKU)
	b = wire.AppendString(b, o.User)
	b = wire.AppendVarint(b, o.Qty)
	b = wire.AppendString(b, string(o.State))
	b = wire.AppendString(b, o.RequestID)
	b = wire.AppendString(b, o.Node)
	b = wire.AppendVarint(b, o.CreatedAtUnixNano)
	b = wire.AppendVarint(b, o.ExpiresAtUnixNano)
	return wire.AppendString(b, o.ReleaseReason)
}

// decodeOrder reads an order appendOrder wrote.
func decodeOrder(d *wire.Decoder) stock.Order {
	return stock.Order{
		ID: d.String(), SKU: d.String(), User: d.String(), Qty: d.Varint(),
		State: stock.OrderState(d.String()), RequestID: d.String(), Node: d.String(),
		CreatedAtUnixNano: d.Varint(), ExpiresAtUnixNano: d.Varint(), ReleaseReason: d.String(),
	}
}
