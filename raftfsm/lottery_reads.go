package raftfsm

import (
	"encoding/binary"
	"fmt"

	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// EntryStatus reads user's entry into lottery sku: ok is false when the
// user has none (or sku is no lottery).
func (l *Ledger) EntryStatus(sku, user string) (stock.EntryStatus, bool, error) {
	row, _, ok := l.SKU(sku)
	if !ok || row.Lottery == nil {
		return stock.EntryStatus{}, false, nil
	}
	v, err := l.read(store.BucketEntryUsers, appendBuyerKey(nil, sku, user))
	if err != nil || v == nil {
		return stock.EntryStatus{}, false, err
	}
	if len(v) != 8 {
		return stock.EntryStatus{}, false, fmt.Errorf("%w: entry index of %q in %q", ErrMalformed, user, sku)
	}
	seq := int64(binary.BigEndian.Uint64(v))
	rec, err := l.read(store.BucketEntries, lottery.EntryKey(sku, seq))
	if err != nil || rec == nil {
		return stock.EntryStatus{}, false, err
	}
	e, err := lottery.DecodeEntryRecord(sku, seq, rec)
	if err != nil {
		return stock.EntryStatus{}, false, err
	}
	st := stock.EntryStatus{Entry: e, State: stock.EntryEntered}
	lt := row.Lottery
	if !lt.Drawn() {
		if row.Closed() {
			st.State = stock.EntryLost
		}
		return st, true, nil
	}
	if seq > lt.Entries {
		// Read between the entry's write and its row's: not yet
		// visible as drawn state (cannot happen after a draw).
		return st, true, nil
	}
	rank := int64(l.rankings.Get(sku, lt).RankOf[seq-1])
	st.Rank = rank + 1
	switch {
	case rank < lt.Won():
		st.State, st.OrderID = stock.EntryWon, lottery.OrderID(lt.OrderKey, sku, seq)
	case lt.WaitlistLostAtUnixNano != 0:
		st.State = stock.EntryLost
	default:
		st.State, st.Position = stock.EntryWaitlisted, rank-lt.Won()+1
	}
	return st, true, nil
}

// SaleEntries calls fn for every committed entry of lottery sku in log
// order, from one consistent state of the ledger file, and returns the
// applied index that state reflects. It writes pending changes first.
func (l *Ledger) SaleEntries(sku string, fn func(*stock.Entry) error) (uint64, error) {
	if err := l.Flush(); err != nil {
		return 0, err
	}
	var applied uint64
	err := l.view(func(tx *bolt.Tx) error {
		applied = store.AppliedIn(tx)
		return lottery.EachEntry(tx.Bucket(store.BucketEntries), sku, fn)
	})
	return applied, err
}
