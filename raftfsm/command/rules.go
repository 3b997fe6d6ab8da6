package command

import "stockd.dev/stockd/internal/wire"

// SetRules switches the ledger to Rules, from the next entry on. Rules
// only go up: a SetRules at or below the ledger's rules changes nothing.
type SetRules struct{ Rules uint64 }

// Op is OpSetRules.
func (*SetRules) Op() Op { return OpSetRules }

func (c *SetRules) appendFields(b []byte) []byte { return wire.AppendUvarint(b, c.Rules) }

func (c *SetRules) decodeFields(d *wire.Decoder) { c.Rules = d.Uvarint() }
