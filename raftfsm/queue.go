package raftfsm

import (
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// queueTxn is the applier as the waiting room's apply sees it.
type queueTxn struct{ *applier }

func (t queueTxn) Get(bucket, key []byte) ([]byte, error) { return t.get(bucket, key) }
func (t queueTxn) Put(bucket, key, value []byte)          { t.put(bucket, key, value) }
func (t queueTxn) At() int64                              { return t.at }

// ledgerReader reads the ledger's records as the waiting room's reads
// want them.
type ledgerReader struct{ *Ledger }

func (r ledgerReader) Get(bucket, key []byte) ([]byte, error) { return r.read(bucket, key) }

// Ticket reads the waiting-room ticket whose secret is secret, with its
// sale's row: ok is false when there is none.
func (l *Ledger) Ticket(secret string) (stock.SKU, stock.Ticket, bool, error) {
	sku, n, ok, err := waitroom.Find(ledgerReader{l}, secret)
	if err != nil || !ok {
		return stock.SKU{}, stock.Ticket{}, false, err
	}
	return l.QueueTicket(sku, n)
}

// QueueTicket reads sale sku's ticket of join index n (a Join's result).
func (l *Ledger) QueueTicket(sku string, n int64) (stock.SKU, stock.Ticket, bool, error) {
	row, _, ok := l.SKU(sku)
	if !ok || row.Queue == nil || n < 1 || n > row.Queue.Joined {
		return stock.SKU{}, stock.Ticket{}, false, nil // the row may trail its ticket's record for a moment
	}
	t, err := waitroom.Read(ledgerReader{l}, &row, n)
	return row, t, err == nil, err
}
