package raftfsm

import (
	"fmt"

	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// AuditSKU recounts the orders of one SKU and checks them and the
// conservation law against the row. ok is false when the SKU is unknown.
// It scans every order: audits are rare, and AuditAll does all SKUs in one
// pass.
func (l *Ledger) AuditSKU(sku string) (stock.Audit, bool, error) {
	all, err := l.audit(func(s string) bool { return s == sku })
	if err != nil {
		return stock.Audit{}, true, fmt.Errorf("audit sku %q: %w", sku, err)
	}
	a, ok := all[sku]
	return a, ok, nil
}

// AuditAll audits every SKU in one pass over the orders.
func (l *Ledger) AuditAll() (map[string]stock.Audit, error) {
	return l.audit(func(string) bool { return true })
}

// audit reads rows, orders and the applied index in one bbolt transaction,
// so it sees one consistent state while Apply goes on, and checks the SKUs
// that want accepts.
func (l *Ledger) audit(want func(sku string) bool) (map[string]stock.Audit, error) {
	// The audit reads bbolt alone: write what is pending first.
	if err := l.Flush(); err != nil {
		return nil, err
	}
	var audits map[string]*stock.Audit
	err := l.view(func(tx *bolt.Tx) error {
		// While the transaction holds the file open: a compaction or a
		// restore closes a swapped-out file only after its readers.
		defer store.DropResidentPages(tx.DB())
		var err error
		audits, err = store.ReadAudits(tx, want)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]stock.Audit, len(audits))
	for sku, a := range audits {
		a.Judge()
		out[sku] = *a
	}
	return out, nil
}
