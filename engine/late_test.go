package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestEngine_NoWinStartsAfterASoldOutAnswer(t *testing.T) {
	for _, noWait := range []bool{false, true} {
		tn := startTestNode(t, t.TempDir(), nil)
		sku := fmt.Sprintf("late-%v", noWait)
		const units, buyers, workers = 1000, 20000, 64
		if _, err := tn.engine.CreateSale(sku, SaleSpec{Total: units}); err != nil {
			t.Fatal(err)
		}
		type span struct {
			start, end time.Time
			status     Status
			detail     string
		}
		var mu sync.Mutex
		var spans []span
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := w; b < buyers; b += workers {
					t0 := time.Now()
					res := tn.deduct(sku, fmt.Sprintf("u%d", b), fmt.Sprintf("r%d", b), 1, noWait)
					t1 := time.Now()
					mu.Lock()
					spans = append(spans, span{t0, t1, res.Status, res.Detail})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		var first time.Time
		for _, s := range spans {
			if s.status == StatusSoldOut && (first.IsZero() || s.end.Before(first)) {
				first = s.end
			}
		}
		late := 0
		for _, s := range spans {
			if s.status.Won() && s.start.After(first) {
				late++
				if late < 4 {
					t.Errorf("noWait=%v: a win started %s after the first sold_out", noWait, s.start.Sub(first))
				}
			}
		}
		if late > 0 {
			t.Errorf("noWait=%v: %d late wins", noWait, late)
		}
		tn.checkLedger(sku)
	}
}
