package raftfsm

import (
	"encoding/binary"
	"fmt"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
)

// entryOf reads user's entry into sku as this batch sees it.
func (a *applier) entryOf(sku, user string) (stock.Entry, bool, error) {
	v, err := a.get(store.BucketEntryUsers, appendBuyerKey(nil, sku, user))
	if err != nil || v == nil {
		return stock.Entry{}, false, err
	}
	if len(v) != 8 {
		return stock.Entry{}, false, fmt.Errorf("%w: entry index of %q in %q", ErrMalformed, user, sku)
	}
	e, err := a.entry(sku, int64(binary.BigEndian.Uint64(v)))
	return e, err == nil, err
}

func (a *applier) entry(sku string, seq int64) (stock.Entry, error) {
	v, err := a.get(store.BucketEntries, lottery.EntryKey(sku, seq))
	if err != nil {
		return stock.Entry{}, err
	}
	if v == nil {
		panic(fmt.Sprintf("BUG: entry %d of lottery %q is missing", seq, sku))
	}
	return lottery.DecodeEntryRecord(sku, seq, v)
}

func (a *applier) enter(c *command.Enter) (*command.Result, error) {
	res := &command.Result{Outcome: stock.OutcomeOK, Entries: make([]command.EntryResult, len(c.Entries))}
	for i := range c.Entries {
		e := &c.Entries[i]
		r := &res.Entries[i]
		if e.User == "" || len(e.User) > maxKeyBytes || len(e.SKU) > maxKeyBytes || len(e.RequestID) > maxKeyBytes {
			r.Outcome = stock.OutcomeInvalid
			continue
		}
		s := a.sku(e.SKU)
		if s == nil {
			r.Outcome = stock.OutcomeUnknownSKU
			continue
		}
		if s.Lottery == nil {
			r.Outcome = stock.OutcomeNotLottery
			continue
		}
		prior, ok, err := a.entryOf(e.SKU, e.User)
		if err != nil {
			return nil, err
		}
		if ok {
			r.Outcome, r.Entry = stock.OutcomeSame, prior
			continue
		}
		// Deducts and entries share one id space per user: an id the
		// user already bought with, or entered another lottery with, is
		// not this entry's (the user's entry into this lottery, under any
		// id, was answered above).
		var reqKey string
		if e.RequestID != "" && a.rules >= RulesScopedRequestIDs {
			rp, err := a.priorRequest(e.User, e.RequestID)
			if err != nil {
				return nil, err
			}
			if rp.order != nil || rp.entrySKU != "" {
				r.Outcome = stock.OutcomeRequestIDReused
				continue
			}
			reqKey = rp.key
		}
		lt := s.Lottery
		if s.Closed() || lt.Drawn() || a.at >= s.Config.EntriesCloseAtUnixNano || lt.Entries >= lottery.MaxEntries {
			r.Outcome = stock.OutcomeEntriesClosed
			continue
		}
		lt.Entries++
		lt.EntriesHash = lottery.NextEntriesHash(lt.EntriesHash, e.User)
		ent := stock.Entry{SKU: e.SKU, Seq: lt.Entries, User: e.User, RequestID: e.RequestID, AtUnixNano: a.at}
		a.put(store.BucketEntries, lottery.EntryKey(e.SKU, ent.Seq), lottery.EncodeEntryRecord(&ent))
		a.put(store.BucketEntryUsers, appendBuyerKey(nil, e.SKU, e.User), binary.BigEndian.AppendUint64(nil, uint64(ent.Seq)))
		if reqKey != "" {
			a.rememberRequest(reqKey, requestEntryValue(e.SKU), a.at)
		}
		r.Outcome, r.Entry = stock.OutcomeOK, ent
	}
	return res, a.flushRequestGroup()
}

func (a *applier) draw(c *command.Draw) (*command.Result, error) {
	s := a.sku(c.SKU)
	switch {
	case s == nil:
		return &command.Result{Outcome: stock.OutcomeUnknownSKU}, nil
	case s.Lottery == nil:
		return &command.Result{Outcome: stock.OutcomeNotLottery}, nil
	case s.Lottery.Drawn():
		return &command.Result{Outcome: stock.OutcomeSame, Qty: s.Lottery.Winners}, nil
	case s.Closed():
		return &command.Result{Outcome: stock.OutcomeClosed}, nil
	case a.at < s.Config.EntriesCloseAtUnixNano:
		return &command.Result{Outcome: stock.OutcomeInvalidState, Detail: "entries are still open"}, nil
	}
	lt := s.Lottery
	lt.DrawnAtUnixNano = a.at
	if lt.Entries == 0 && a.rules >= RulesEmptyDrawCloses {
		// Nobody can win, and a lottery takes no deducts: no unit can
		// reach a buyer, so the sale closes with its units available.
		a.closeSale(&command.CloseSale{SKU: c.SKU})
		return &command.Result{Outcome: stock.OutcomeOK}, nil
	}
	rk := a.ledger.rankings.Get(c.SKU, lt)
	winners := min(s.Available, lt.Entries)
	for r := range winners {
		if err := a.award(s, int64(rk.Seqs[r])); err != nil {
			return nil, err
		}
	}
	lt.Winners = winners
	if err := a.settleWaitlist(s); err != nil {
		return nil, err
	}
	return &command.Result{Outcome: stock.OutcomeOK, Qty: winners}, nil
}

// award gives one unit of lottery s to entry seq: an order, held for the
// sale's hold_ttl or sold at once.
func (a *applier) award(s *stock.SKU, seq int64) error {
	e, err := a.entry(s.SKU, seq)
	if err != nil {
		return err
	}
	if s.Available < 1 {
		panic(fmt.Sprintf("BUG: lottery %q awards entry %d with no unit available", s.SKU, seq))
	}
	o := stock.Order{ID: lottery.OrderID(s.Lottery.OrderKey, s.SKU, seq), SKU: s.SKU, User: e.User, Qty: 1,
		Node: lottery.Node, CreatedAtUnixNano: a.at}
	if prior, err := a.getOrder(o.ID); err != nil || prior != nil {
		if err != nil {
			return err
		}
		panic(fmt.Sprintf("BUG: lottery %q awards entry %d order id %q, which order %+v has", s.SKU, seq, o.ID, *prior))
	}
	s.Available--
	if ttl := s.Config.HoldTTLNanos; ttl > 0 {
		o.State, o.ExpiresAtUnixNano = stock.OrderHeld, a.at+ttl
		s.Held++
		a.holdChanges[o.ID] = o.ExpiresAtUnixNano
	} else {
		o.State = stock.OrderSold
		s.Sold++
	}
	if err := a.putOrder(&o); err != nil {
		return err
	}
	a.feedEvent(stock.FeedOrderCreated, &o)
	return nil
}

// purgeEntries takes up to n more entries of archived lottery s out of
// the ledger, in sequence order.
func (a *applier) purgeEntries(s *stock.SKU, n int64) error {
	lt := s.Lottery
	for end := min(lt.Entries, lt.PurgedEntries+n); lt.PurgedEntries < end; lt.PurgedEntries++ {
		seq := lt.PurgedEntries + 1
		e, err := a.entry(s.SKU, seq)
		if err != nil {
			return err
		}
		a.put(store.BucketEntries, lottery.EntryKey(s.SKU, seq), nil)
		a.put(store.BucketEntryUsers, appendBuyerKey(nil, s.SKU, e.User), nil)
		if e.RequestID != "" {
			// Held under its scoped key if the entry came after the
			// switch to scoped ids; earlier entries held none.
			if _, err := a.forgetRequestKey(e.AtUnixNano, requestKey(e.User, e.RequestID), requestEntryValue(s.SKU)); err != nil {
				return err
			}
		}
	}
	return nil
}

// settleWaitlist gives a drawn lottery's available units to the next
// waitlisted entries, then marks the waitlist lost once no unit can come
// back (nothing held). A closed sale's waitlist is lost at once.
func (a *applier) settleWaitlist(s *stock.SKU) error {
	lt := s.Lottery
	if lt == nil || !lt.Drawn() || lt.WaitlistLostAtUnixNano != 0 {
		return nil
	}
	if !s.Closed() {
		var rk *lottery.Ranking
		for s.Available > 0 && lt.Won() < lt.Entries {
			if rk == nil {
				rk = a.ledger.rankings.Get(s.SKU, lt)
			}
			if err := a.award(s, int64(rk.Seqs[lt.Won()])); err != nil {
				return err
			}
			lt.Promoted++
		}
	}
	if lt.Won() < lt.Entries && (s.Held == 0 || s.Closed()) {
		lt.WaitlistLostAtUnixNano = max(a.at, 1)
	}
	return nil
}
