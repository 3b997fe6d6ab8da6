package engine

import (
	"fmt"
	"testing"
)

// TestDeductBatch_ItemsJudgedInOrder: batches of 1,000 buyers over a
// 300-unit sale, on a node that must lease its units as it goes: the
// winners are exactly the first 300 items, each time.
func TestDeductBatch_ItemsJudgedInOrder(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), func(c *Config) { c.LeaseChunkMax = 16 })
	const items, units = 1000, 300
	for round := range 5 {
		sku := fmt.Sprintf("b-%d", round)
		if _, err := tn.engine.CreateSale(sku, SaleSpec{Total: units}); err != nil {
			t.Fatal(err)
		}
		reqs := make([]DeductRequest, items)
		for i := range reqs {
			reqs[i] = DeductRequest{SKU: []byte(sku), User: []byte(fmt.Sprintf("u-%d", i)), RequestID: []byte(fmt.Sprintf("%s-%d", sku, i)), Qty: 1, Hint: uint32(i)}
		}
		res := make([]DeductResult, items)
		tn.engine.DeductBatch(reqs, res)
		for i, r := range res {
			if won := r.Status == StatusOK; won != (i < units) {
				t.Fatalf("round %d: item %d answered %s (%s); the first %d items win", round, i, r.Status, r.Detail, units)
			}
		}
		if a := tn.checkLedger(sku); a.Row.Sold != units {
			t.Fatalf("round %d: sold %d", round, a.Row.Sold)
		}
	}
}
