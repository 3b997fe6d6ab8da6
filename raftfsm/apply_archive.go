package raftfsm

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strings"
)

// orderSeqPrefix keys, in the meta bucket, a node's highest order
// sequence once orders of it were archived (the orders themselves no
// longer tell it).
const orderSeqPrefix = "order_seq/"

func orderSeqKey(node string) []byte { return []byte(orderSeqPrefix + node) }

// loadOrderSeqs raises high to the marks kept in meta.
func loadOrderSeqs(meta interface {
	ForEach(func(k, v []byte) error) error
}, high map[string]uint64) error {
	return meta.ForEach(func(k, v []byte) error {
		if node, ok := strings.CutPrefix(string(k), orderSeqPrefix); ok && len(v) == 8 {
			high[node] = max(high[node], binary.BigEndian.Uint64(v))
		}
		return nil
	})
}

// Closing and archiving a sale (docs/feed-and-lottery.md): a closed
// sale takes nothing new; an archived one's orders leave the ledger in
// bounded PurgeArchived steps, its totals stay.

// purgeScanMax bounds the order records one PurgeArchived step reads.
const purgeScanMax = 100_000

func (a *applier) closeSale(c *command.CloseSale) *command.Result {
	s := a.sku(c.SKU)
	if s == nil {
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}
	}
	if s.Closed() {
		return &command.Result{Outcome: stock.OutcomeSame}
	}
	s.ClosedAtUnixNano = max(a.at, 1)
	var back int64
	for _, n := range s.Leased {
		back += n
	}
	s.Available += back
	s.Leased = nil
	a.event(Event{Kind: EventSaleClosed, SKU: c.SKU, Qty: back})
	_ = a.settleWaitlist(s) // a closed lottery's waitlist is lost; nothing is read
	return &command.Result{Outcome: stock.OutcomeOK, Qty: back}
}

func (a *applier) archiveSale(c *command.ArchiveSale) *command.Result {
	s := a.sku(c.SKU)
	switch {
	case s == nil:
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}
	case s.Archived:
		return &command.Result{Outcome: stock.OutcomeSame}
	case !s.Closed():
		return &command.Result{Outcome: stock.OutcomeNotClosed, Detail: "close the sale first"}
	case s.Held > 0:
		return &command.Result{Outcome: stock.OutcomeHoldsPending, Detail: fmt.Sprintf("%d units are still held: they may be confirmed until they expire", s.Held)}
	}
	for _, cons := range a.consumers() {
		if cons.Cursor.Seq < s.LastEventSeq {
			return &command.Result{Outcome: stock.OutcomeUnconsumed, Detail: fmt.Sprintf("consumer %q has acknowledged up to event %d; the sale's last is %d", cons.Name, cons.Cursor.Seq, s.LastEventSeq)}
		}
	}
	s.Archived = true
	return &command.Result{Outcome: stock.OutcomeOK}
}

// consumers is every consumer of the feed as this batch sees it.
func (a *applier) consumers() []stock.Consumer {
	committed := a.ledger.feed.Consumers()
	out := make([]stock.Consumer, 0, len(committed))
	for name, c := range committed {
		if staged, ok := a.feed.consumers[name]; ok {
			if staged != nil {
				out = append(out, *staged)
			}
			continue
		}
		out = append(out, c)
	}
	for name, c := range a.feed.consumers {
		if _, ok := committed[name]; !ok && c != nil {
			out = append(out, *c)
		}
	}
	return out
}

// purgeArchived takes the archived sale's orders out of the next records
// after c.After (which must be where the last step stopped), with their
// request ids and per-user counts.
func (a *applier) purgeArchived(c *command.PurgeArchived) (*command.Result, error) {
	s := a.sku(c.SKU)
	switch {
	case a.rules >= RulesNamedPurges:
		return invalid("under ledger rules %d an archive's purge names its orders (purge_orders)", a.rules), nil
	case s == nil:
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}, nil
	case !s.Archived:
		return &command.Result{Outcome: stock.OutcomeInvalidState, Detail: "the sale is not archived"}, nil
	case s.PurgeDone || c.After != s.PurgeAfter:
		return &command.Result{Outcome: stock.OutcomeSame}, nil // a step proposed twice
	case c.Scan < 1 || c.Scan > purgeScanMax:
		return invalid("purge scan %d outside 1..%d", c.Scan, purgeScanMax), nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	var from []byte // nil: from the first
	if c.After != "" {
		from = []byte(c.After)
	}
	var doomed []stock.Order
	var blocked []bool                           // doomed[i] is a block's member
	type blockLeft struct{ key, members string } // a block's value without the sale's members
	var kept []blockLeft
	scanned, last := int64(0), c.After
	var decodeErr error
	store.AscendAfter(tx, a.bh, a.batch[string(store.BucketOrders)], store.BucketOrders, from, func(k, v []byte) bool {
		if scanned >= c.Scan {
			return false
		}
		last = string(k)
		if !store.IsOrderBlockKey(k) {
			scanned++
			o, err := store.DecodeOrderRecord(last, v)
			if err != nil {
				decodeErr = err
				return false
			}
			if o.SKU == c.SKU {
				doomed, blocked = append(doomed, o), append(blocked, false)
			}
			return true
		}
		// A block is scanned whole: its members of the sale leave, the
		// others stay in it.
		out, stays, n, err := splitBlock(k, v, c.SKU)
		if err != nil {
			decodeErr = err
			return false
		}
		scanned += int64(n)
		for range out {
			blocked = append(blocked, true)
		}
		doomed = append(doomed, out...)
		if len(stays) < len(v) {
			kept = append(kept, blockLeft{last, string(stays)})
		}
		return true
	})
	if decodeErr != nil {
		return nil, decodeErr
	}
	for _, b := range kept {
		var v []byte // no member left: the block goes
		if len(b.members) > 1 {
			v = []byte(b.members)
		}
		a.putKey(store.BucketOrders, b.key, v)
	}
	for i := range doomed {
		if !blocked[i] {
			a.putKey(store.BucketOrders, doomed[i].ID, nil)
		}
	}
	if err := a.forgetArchived(s, doomed); err != nil {
		return nil, err
	}
	s.PurgeAfter = last
	res := &command.Result{Outcome: stock.OutcomeOK, Qty: int64(len(doomed))}
	if scanned < c.Scan {
		// The orders are out; a lottery's entries follow, in the rest
		// of this step's budget and the next steps'.
		if lt := s.Lottery; lt != nil && lt.PurgedEntries < lt.Entries {
			if err := a.purgeEntries(s, max(c.Scan-scanned, 1)); err != nil {
				return nil, err
			}
			if lt.PurgedEntries < lt.Entries {
				return res, nil
			}
			a.ledger.rankings.Forget(s.SKU)
		}
		s.PurgeDone = true
		res.Detail = "done"
		a.purgeDone = true
	}
	return res, nil
}

// forgetArchived does the rest of taking out an archived sale's orders,
// once their records are gone: their ids' sequences stay known, their
// request ids and per-user counts leave, the sale counts them archived.
// What it writes does not depend on the orders' order.
func (a *applier) forgetArchived(s *stock.SKU, doomed []stock.Order) error {
	a.holdRequestGroups()
	defer a.writeRequestGroups()
	// A take of an id at or below a kept sequence is never taken for new
	// (take's check against its node's highest sequence), here or on a
	// node that rebuilds the marks from the file.
	marked := map[string]bool{}
	for i := range doomed {
		if owner, _, ok := orderSeq(doomed[i].ID); ok && !marked[owner] {
			marked[owner] = true
			a.put(store.BucketMeta, orderSeqKey(owner), binary.BigEndian.AppendUint64(nil, a.ledger.orderSeqsOf(owner).high))
		}
	}
	for i := range doomed {
		o := &doomed[i]
		if o.State == stock.OrderHeld {
			panic(fmt.Sprintf("BUG: held order %q of archived sale %q", o.ID, o.SKU))
		}
		if o.RequestID != "" {
			if err := a.forgetOrderRequest(o); err != nil {
				return err
			}
		}
		if s.Config.PerUser > 0 {
			key := appendBuyerKey(nil, o.SKU, o.User)
			a.put(store.BucketBuyers, key, nil)
			a.boughtChanges[string(key)] = 0
		}
		if o.State == stock.OrderSold {
			s.ArchivedSold += o.Qty
		}
		s.ArchivedOrders++
	}
	return nil
}

// purgeOrders applies a PurgeOrders step: the named orders of the sale
// leave, wherever this node's file keeps them (a record of their own or a
// block), then some of a lottery's entries.
func (a *applier) purgeOrders(c *command.PurgeOrders) (*command.Result, error) {
	s := a.sku(c.SKU)
	switch {
	case a.rules < RulesNamedPurges:
		return invalid("purge_orders needs ledger rules %d (the ledger runs %d)", RulesNamedPurges, a.rules), nil
	case s == nil:
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}, nil
	case !s.Archived:
		return &command.Result{Outcome: stock.OutcomeInvalidState, Detail: "the sale is not archived"}, nil
	case s.PurgeDone:
		return &command.Result{Outcome: stock.OutcomeSame}, nil
	case len(c.IDs) > command.PurgeOrdersMax || c.Entries < 0 || c.Entries > purgeScanMax:
		return invalid("a purge step names up to %d orders and %d entries", command.PurgeOrdersMax, purgeScanMax), nil
	}
	doomed, err := a.takeOutOrders(c.SKU, c.IDs)
	if err != nil {
		return nil, err
	}
	if err := a.forgetArchived(s, doomed); err != nil {
		return nil, err
	}
	res := &command.Result{Outcome: stock.OutcomeOK, Qty: int64(len(doomed))}
	lt := s.Lottery
	if lt != nil && c.Entries > 0 && lt.PurgedEntries < lt.Entries {
		if err := a.purgeEntries(s, c.Entries); err != nil {
			return nil, err
		}
	}
	if c.OrdersDone && (lt == nil || lt.PurgedEntries >= lt.Entries) {
		if lt != nil {
			a.ledger.rankings.Forget(s.SKU)
		}
		s.PurgeDone = true
		res.Detail = "done"
		a.purgeDone = true
	}
	return res, nil
}

// takeOutOrders deletes the orders of sku among ids, from their records
// or their blocks, and returns them sorted by id (so that what follows
// does not depend on where this file kept each).
func (a *applier) takeOutOrders(sku string, ids []string) ([]stock.Order, error) {
	if err := a.flushOrderBlock(); err != nil {
		return nil, err
	}
	var doomed []stock.Order
	inBlocks := map[string]map[string]bool{} // block key -> ids of its members to take out
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] || store.IsOrderBlockKey([]byte(id)) {
			continue // a block's key names no order
		}
		seen[id] = true
		v, err := a.get(store.BucketOrders, []byte(id))
		if err != nil {
			return nil, err
		}
		if v != nil {
			o, err := store.DecodeOrderRecord(id, v)
			if err != nil {
				return nil, err
			}
			if o.SKU == sku {
				a.putKey(store.BucketOrders, id, nil)
				doomed = append(doomed, o)
			}
			continue
		}
		if key, _, _, ok := store.OrderBlockPlace(id); ok {
			if inBlocks[key] == nil {
				inBlocks[key] = map[string]bool{}
			}
			inBlocks[key][id] = true
		}
	}
	var id []byte
	for _, key := range slices.Sorted(maps.Keys(inBlocks)) {
		v, err := a.get(store.BucketOrders, []byte(key))
		if err != nil || v == nil {
			if err != nil {
				return nil, err
			}
			continue
		}
		b, err := store.ParseOrderBlock([]byte(key), v)
		if err != nil {
			return nil, err
		}
		stays := []byte{store.OrderBlockFormat}
		var failed error
		err = b.Each(func(off int, m *store.BlockMember) bool {
			if id = b.AppendID(id[:0], m); inBlocks[key][string(id)] {
				o, err := store.DecodeOrderRecord(string(id), m.Record)
				if err != nil {
					failed = err
					return false
				}
				if o.SKU == sku {
					doomed = append(doomed, o)
					return true
				}
			}
			stays = append(stays, v[off:m.Next]...)
			return true
		})
		if err = cmp.Or(failed, err); err != nil {
			return nil, err
		}
		if len(stays) == 1 {
			stays = nil // no member left
		}
		if len(stays) < len(v) {
			a.putKey(store.BucketOrders, key, stays)
		}
	}
	slices.SortFunc(doomed, func(x, y stock.Order) int { return strings.Compare(x.ID, y.ID) })
	return doomed, nil
}

// splitBlock reads order block k (value v) and returns its members of
// sku, the block's value without them, and how many members it read.
func splitBlock(k, v []byte, sku string) (out []stock.Order, stays []byte, n int, err error) {
	b, err := store.ParseOrderBlock(k, v)
	if err != nil {
		return nil, nil, 0, err
	}
	stays = []byte{store.OrderBlockFormat}
	var failed error
	err = b.Each(func(off int, m *store.BlockMember) bool {
		n++
		o, err := b.Order(m)
		if err != nil {
			failed = err
			return false
		}
		if o.SKU == sku {
			out = append(out, o)
		} else {
			stays = append(stays, v[off:m.Next]...)
		}
		return true
	})
	return out, stays, n, cmp.Or(failed, err)
}
