package engine

import (
	"fmt"
	"testing"
	"time"
)

func TestAdmission_InFlightCap(t *testing.T) {
	a := newAdmission(0, 0, 2)
	now := time.Now()
	ok1, _ := a.admit(0, now)
	ok2, _ := a.admit(1, now)
	ok3, retry := a.admit(2, now)
	if !ok1 || !ok2 || ok3 || retry <= 0 {
		t.Fatalf("cap 2: admitted %v %v %v (retry %s)", ok1, ok2, ok3, retry)
	}
	a.done()
	if ok, _ := a.admit(3, now); !ok {
		t.Fatal("a slot freed by done was not given out")
	}
	if got := a.inFlight.Load(); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
}

func TestAdmission_TokenBucketRefills(t *testing.T) {
	a := newAdmission(80, 8, 0) // 8 shards: 10/s and a burst of 1 each
	now := time.Now()
	if ok, _ := a.admit(5, now); !ok {
		t.Fatal("first deduct refused")
	}
	ok, retry := a.admit(5, now)
	if ok || retry != 100*time.Millisecond {
		t.Fatalf("second deduct in the same instant: admitted %v, retry %s (want refused, 100ms)", ok, retry)
	}
	if ok, _ := a.admit(6, now); !ok {
		t.Fatal("another shard's token was not there")
	}
	if ok, _ := a.admit(5, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("token not refilled after its interval")
	}
}

func TestEngine_RateLimitAnswers429BeforeStock(t *testing.T) {
	var clock fakeClock
	tn := startTestNode(t, t.TempDir(), func(c *Config) {
		c.Now = func() time.Time { return time.Unix(1_800_000_000, 0).Add(time.Duration(clock.offset.Load())) }
		c.RateLimit, c.RateBurst = 8, 8 // one token per shard, one per second
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
