package command

import "stockd.dev/stockd/internal/wire"

// Enter is a batch of lottery entries; each is accepted or refused on its
// own, like a Take's.
type Enter struct{ Entries []EnterEntry }

// EnterEntry is one user's entry into lottery SKU.
type EnterEntry struct {
	SKU       string
	User      string
	RequestID string
}

// EncodedSize is the bytes the entry adds to an encoded Enter.
func (e *EnterEntry) EncodedSize() int {
	return wire.UvarintLen(len(e.SKU)) + len(e.SKU) + wire.UvarintLen(len(e.User)) + len(e.User) +
		wire.UvarintLen(len(e.RequestID)) + len(e.RequestID)
}

// EnterHeaderSize bounds the bytes an encoded Enter needs besides its
// entries.
const EnterHeaderSize = commandHeaderMax + wire.MaxVarintBytes

// Draw draws a lottery's winners; the leader proposes it once entries
// have closed. A second Draw of the same sale is OutcomeSame.
type Draw struct{ SKU string }

func (*Enter) Op() Op { return OpEnter }

func (*Draw) Op() Op { return OpDraw }

func (c *Enter) appendFields(b []byte) []byte {
	b = wire.AppendUvarint(b, uint64(len(c.Entries)))
	for i := range c.Entries {
		e := &c.Entries[i]
		b = wire.AppendString(wire.AppendString(wire.AppendString(b, e.SKU), e.User), e.RequestID)
	}
	return b
}

func (c *Enter) decodeFields(d *wire.Decoder) {
	c.Entries = make([]EnterEntry, d.Count(3))
	for i := range c.Entries {
		e := &c.Entries[i]
		e.SKU, e.User, e.RequestID = d.String(), d.String(), d.String()
	}
}

func (c *Draw) appendFields(b []byte) []byte { return wire.AppendString(b, c.SKU) }

func (c *Draw) decodeFields(d *wire.Decoder) { c.SKU = d.String() }
