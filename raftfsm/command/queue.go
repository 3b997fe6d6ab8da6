package command

import "stockd.dev/stockd/internal/wire"

// The waiting room's commands (stock.AdmissionQueue sales). Joins are
// batched like takes; the leader's loop proposes a QueueTick per queued
// sale that has something to do (the open, expiries, admissions), and a
// RotateQueueKey a day.

// Join is a batch of waiting-room joins; each is accepted or answered
// with the user's ticket on its own.
type Join struct{ Entries []JoinEntry }

// JoinEntry is one user's join of queued sale SKU. Secret is the new
// ticket's, drawn by the node that took the join (JoinSecretBytes random
// bytes, hex): the ledger keeps it, so a second join of the user on any
// node answers the first ticket with it.
type JoinEntry struct {
	SKU    string
	User   string
	Secret string
}

// JoinSecretBytes is the randomness of a ticket's secret.
const JoinSecretBytes = 16

// EncodedSize is the bytes the entry adds to an encoded Join.
func (e *JoinEntry) EncodedSize() int {
	return wire.UvarintLen(len(e.SKU)) + len(e.SKU) + wire.UvarintLen(len(e.User)) + len(e.User) +
		wire.UvarintLen(len(e.Secret)) + len(e.Secret)
}

// JoinHeaderSize bounds the bytes an encoded Join needs besides its
// entries.
const JoinHeaderSize = commandHeaderMax + wire.MaxVarintBytes

// QueueTick moves queued sale SKU along at the command's time: the open
// once start_at has passed (the tickets joined before it put in the
// drawn order), the expiry of admissions whose token ran out, then
// admissions in position order up to position Through, as far as the
// bound lets (0: none).
type QueueTick struct {
	SKU     string
	Through int64
}

// RotateQueueKey makes Key (KeySize bytes, drawn by the proposer) the
// current signing key of SKU's tokens; the current one becomes the
// previous, which still verifies, and the one before it stops verifying.
type RotateQueueKey struct {
	SKU string
	Key []byte
}

func (*Join) Op() Op           { return OpJoin }
func (*QueueTick) Op() Op      { return OpQueueTick }
func (*RotateQueueKey) Op() Op { return OpRotateQueueKey }

func (c *Join) appendFields(b []byte) []byte {
	b = wire.AppendUvarint(b, uint64(len(c.Entries)))
	for i := range c.Entries {
		e := &c.Entries[i]
		b = wire.AppendString(wire.AppendString(wire.AppendString(b, e.SKU), e.User), e.Secret)
	}
	return b
}

func (c *Join) decodeFields(d *wire.Decoder) {
	c.Entries = make([]JoinEntry, d.Count(3))
	for i := range c.Entries {
		e := &c.Entries[i]
		e.SKU, e.User, e.Secret = d.String(), d.String(), d.String()
	}
}

func (c *QueueTick) appendFields(b []byte) []byte {
	return wire.AppendVarint(wire.AppendString(b, c.SKU), c.Through)
}

func (c *QueueTick) decodeFields(d *wire.Decoder) { c.SKU, c.Through = d.String(), d.Varint() }

func (c *RotateQueueKey) appendFields(b []byte) []byte {
	return wire.AppendString(wire.AppendString(b, c.SKU), string(c.Key))
}

func (c *RotateQueueKey) decodeFields(d *wire.Decoder) {
	c.SKU = d.String()
	if k := d.String(); k != "" {
		c.Key = []byte(k)
	}
}
