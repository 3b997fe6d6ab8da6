package raftfsm

import (
	"cmp"
	"maps"
	"slices"
	"stockd/raftfsm/orderid"
)

func (c *CreateSale) appendFields(b []byte) []byte {
	b = appendString(b, c.SKU)
	b = appendVarint(b, c.Sale.Total)
	b = appendVarint(b, c.Sale.StartAtUnixNano)
	b = appendVarint(b, c.Sale.PerUser)
	b = appendVarint(b, c.Sale.HoldTTLNanos)
	if c.Sale.Mode == "" && len(c.Secret) == 0 {
		return b // the format of versions before lottery sales
	}
	b = appendString(b, c.Sale.Mode)
	b = appendVarint(b, c.Sale.EntriesCloseAtUnixNano)
	return appendString(b, string(c.Secret))
}

func (c *CreateSale) decodeFields(d *decoder) {
	c.SKU = d.string()
	c.Sale.Total = d.varint()
	c.Sale.StartAtUnixNano = d.varint()
	c.Sale.PerUser = d.varint()
	c.Sale.HoldTTLNanos = d.varint()
	if len(d.b) > 0 && d.err == nil {
		c.Sale.Mode = d.string()
		c.Sale.EntriesCloseAtUnixNano = d.varint()
		if secret := d.string(); secret != "" {
			c.Secret = []byte(secret)
		}
	}
}

func (c *Restock) appendFields(b []byte) []byte {
	return appendVarint(appendString(b, c.SKU), c.Qty)
}

func (c *Restock) decodeFields(d *decoder) { c.SKU, c.Qty = d.string(), d.varint() }

func (c *Lease) appendFields(b []byte) []byte {
	return appendVarint(appendString(appendString(b, c.Node), c.SKU), c.Want)
}

func (c *Lease) decodeFields(d *decoder) { c.Node, c.SKU, c.Want = d.string(), d.string(), d.varint() }

func (c *Return) appendFields(b []byte) []byte {
	return appendVarint(appendString(appendString(b, c.Node), c.SKU), c.Qty)
}

func (c *Return) decodeFields(d *decoder) { c.Node, c.SKU, c.Qty = d.string(), d.string(), d.varint() }

func (c *Take) appendFields(b []byte) []byte {
	// Sized up front: a Take of a thousand entries would otherwise grow
	// its buffer a dozen times.
	n := uvarintLen(len(c.Node)) + len(c.Node) + maxVarintBytes
	for i := range c.Entries {
		e := &c.Entries[i]
		n += maxVarintBytes + uvarintLen(len(e.SKU)) + len(e.SKU) + uvarintLen(len(e.User)) + len(e.User) +
			uvarintLen(len(e.RequestID)) + len(e.RequestID) + uvarintLen(len(e.OrderID)) + len(e.OrderID)
	}
	b = slices.Grow(b, n)
	b = appendString(b, c.Node)
	b = appendUvarint(b, uint64(len(c.Entries)))
	for i := range c.Entries {
		e := &c.Entries[i]
		b = appendString(b, e.SKU)
		b = appendVarint(b, e.Qty)
		b = appendString(b, e.User)
		b = appendString(b, e.RequestID)
		b = appendString(b, e.OrderID)
	}
	return b
}

// minTakeEntryBytes is the smallest encoded entry: four empty strings and
// a one-byte qty. It bounds the entry count a decoder will allocate for.
const minTakeEntryBytes = 5

func (c *Take) decodeFields(d *decoder) {
	c.Node = d.string()
	n := d.count(minTakeEntryBytes)
	c.Entries = make([]TakeEntry, n)
	for i := range c.Entries {
		e := &c.Entries[i]
		e.SKU, e.Qty, e.User, e.RequestID, e.OrderID = d.string(), d.varint(), d.string(), d.string(), d.string()
	}
}

func (c *Confirm) appendFields(b []byte) []byte { return appendString(b, c.OrderID) }

func (c *Confirm) decodeFields(d *decoder) { c.OrderID = d.string() }

func (c *Release) appendFields(b []byte) []byte {
	return appendString(appendString(b, c.OrderID), c.Reason)
}

func (c *Release) decodeFields(d *decoder) { c.OrderID, c.Reason = d.string(), d.string() }

func (c *Reclaim) appendFields(b []byte) []byte { return appendString(b, c.Node) }

func (c *Reclaim) decodeFields(d *decoder) { c.Node = d.string() }

func (c *Register) appendFields(b []byte) []byte {
	return appendString(appendString(b, c.Node), c.Addr)
}

func (c *Register) decodeFields(d *decoder) { c.Node, c.Addr = d.string(), d.string() }

func (c *Expire) appendFields(b []byte) []byte {
	b = appendUvarint(b, uint64(len(c.OrderIDs)))
	for _, id := range c.OrderIDs {
		b = appendString(b, id)
	}
	return b
}

func (c *Expire) decodeFields(d *decoder) {
	c.OrderIDs = make([]string, d.count(1))
	for i := range c.OrderIDs {
		c.OrderIDs[i] = d.string()
	}
}

func (c *PruneRequests) appendFields(b []byte) []byte {
	return appendVarint(appendVarint(b, c.BeforeUnixNano), c.MaxKeep)
}

func (c *PruneRequests) decodeFields(d *decoder) {
	c.BeforeUnixNano, c.MaxKeep = d.varint(), d.varint()
}

func (c *AckConsumer) appendFields(b []byte) []byte {
	b = appendString(b, c.Name)
	b = appendUvarint(appendUvarint(b, c.Cursor.Index), c.Cursor.Seq)
	if c.Drop {
		return append(b, 1)
	}
	return append(b, 0)
}

func (c *AckConsumer) decodeFields(d *decoder) {
	c.Name = d.string()
	c.Cursor = Cursor{Index: d.uvarint(), Seq: d.uvarint()}
	switch d.uvarint() {
	case 0:
	case 1:
		c.Drop = true
	default:
		d.fail("drop flag")
	}
}

func (c *PruneEvents) appendFields(b []byte) []byte {
	return appendUvarint(appendUvarint(b, c.Through.Index), c.Through.Seq)
}

func (c *PruneEvents) decodeFields(d *decoder) {
	c.Through = Cursor{Index: d.uvarint(), Seq: d.uvarint()}
}

func (c *CloseSale) appendFields(b []byte) []byte { return appendString(b, c.SKU) }

func (c *CloseSale) decodeFields(d *decoder) { c.SKU = d.string() }

func (c *ArchiveSale) appendFields(b []byte) []byte { return appendString(b, c.SKU) }

func (c *ArchiveSale) decodeFields(d *decoder) { c.SKU = d.string() }

func (c *PurgeArchived) appendFields(b []byte) []byte {
	return appendVarint(appendString(appendString(b, c.SKU), c.After), c.Scan)
}

func (c *PurgeArchived) decodeFields(d *decoder) {
	c.SKU, c.After, c.Scan = d.string(), d.string(), d.varint()
}

// A PurgeOrders step's ids travel compactly: an engine-shaped id whose
// sequence and random part are canonical base 36 numbers becomes its
// node's entry (the node once, then a sequence delta and the random part
// as varints, about 11 bytes instead of 28); any other id travels whole.
// The raft log holds the encoded step, and its cache keeps the last
// entries in memory.

func (c *PurgeOrders) appendFields(b []byte) []byte {
	type shaped struct{ seq, random uint64 }
	byNode := map[string][]shaped{}
	var other []string
	for _, id := range c.IDs {
		p, ok := orderid.Parse(id)
		random, rok := p.RandomNumber()
		if !ok || !rok || !p.CanonicalSeq() {
			other = append(other, id)
			continue
		}
		byNode[p.Node] = append(byNode[p.Node], shaped{p.Seq, random})
	}
	b = appendUvarint(appendString(b, c.SKU), uint64(len(byNode)))
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		ids := byNode[node]
		slices.SortFunc(ids, func(x, y shaped) int { return cmp.Compare(x.seq, y.seq) })
		b = appendUvarint(appendString(b, node), uint64(len(ids)))
		last := uint64(0)
		for _, id := range ids {
			b = appendUvarint(appendUvarint(b, id.seq-last), id.random)
			last = id.seq
		}
	}
	b = appendUvarint(b, uint64(len(other)))
	for _, id := range other {
		b = appendString(b, id)
	}
	done := int64(0)
	if c.OrdersDone {
		done = 1
	}
	return appendVarint(appendVarint(b, c.Entries), done)
}

func (c *PurgeOrders) decodeFields(d *decoder) {
	c.SKU = d.string()
	c.IDs = nil
	for range d.count(2) {
		node := d.string()
		seq := uint64(0)
		for range d.count(2) {
			seq += d.uvarint()
			random := d.uvarint()
			c.IDs = append(c.IDs, orderid.Format(node, seq, random))
		}
	}
	for range d.count(1) {
		c.IDs = append(c.IDs, d.string())
	}
	c.Entries, c.OrdersDone = d.varint(), d.varint() == 1
}
