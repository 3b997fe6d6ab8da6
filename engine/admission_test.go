package engine

import (
	"fmt"
	"testing"
	"time"
)

func TestEngine_RateLimitAnswers429BeforeStock(t *testing.T) {
	tn := startTestNode(t, t.TempDir(), func(c *Config) {
		c.Now = func() time.Time { return time.Unix(1_800_000_000, 0) } // the tokens do not refill
		c.RateLimit, c.RateBurst = 8, 8                                 // one token per shard, one per second
	})
	if _, err := tn.engine.CreateSale("a", SaleSpec{Total: 100}); err != nil {
		t.Fatal(err)
	}
	counts := map[Status]int{}
	for i := 0; i < 20; i++ {
		req := DeductRequest{SKU: []byte("a"), User: []byte(fmt.Sprintf("u%d", i)), Qty: 1, Hint: 0}
		var res DeductResult
		tn.engine.Deduct(&req, &res)
		counts[res.Status]++
		if res.Status == StatusRateLimited && res.RetryAfter != time.Second {
			t.Fatalf("retry after %s, want 1s", res.RetryAfter)
		}
	}
	if counts[StatusOK] != 1 || counts[StatusRateLimited] != 19 {
		t.Fatalf("outcomes %v, want 1 ok and 19 rate_limited from one shard", counts)
	}
	if a := tn.checkLedger("a"); a.Row.Sold != 1 {
		t.Fatalf("sold %d", a.Row.Sold)
	}
}
