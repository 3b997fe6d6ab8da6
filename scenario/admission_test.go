package scenario

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// openLoad sends deducts at a fixed rate, whatever the answers (an open
// load: arrivals do not wait for earlier answers, so a node that cannot
// keep up sees its queue grow), each in its own goroutine, and returns each
// answer's status and latency. Bounded in count and time.
type loadAnswer struct {
	code    int
	errCode string
	order   string
	took    time.Duration
}

func openLoad(c *fasthttp.HostClient, sku string, perSecond, total int) []loadAnswer {
	out := make([]loadAnswer, total)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for i := range total {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			code, body := nodetest.CallWithin(c, 20*time.Second, "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"open-%d"}`, i, i))
			a := loadAnswer{code: code, took: time.Since(start)}
			if body != nil {
				a.errCode, _ = body["error"].(string)
				a.order, _ = body["order_id"].(string)
			}
			out[i] = a
		}()
	}
	wg.Wait()
	return out
}

// TestAdmission_ASlowLedgerTurnsIntoFast429sNotTimeouts: a ledger slowed
// to about 240 commits a second (50 ms a batch, small batches) under an
// open load of 600 deducts a second. With admission following the ledger,
// the excess gets 429 at once and no admitted deduct times out; without
// it, the queue grows until deducts end in outcome_unknown.
func TestAdmission_ASlowLedgerTurnsIntoFast429sNotTimeouts(t *testing.T) {
	const rate, total = 600, 2400
	for _, adaptive := range []bool{true, false} {
		t.Run(fmt.Sprintf("adaptive=%v", adaptive), func(t *testing.T) {
			cfg := nodetest.NodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
			cfg.FaultApplyDelay = 50 * time.Millisecond
			cfg.Engine.TakeBatchBytesMax = 1 << 10 // about a dozen takes a batch
			cfg.Engine.CommitWait = 2 * time.Second
			cfg.Engine.AdmissionLatency = 300 * time.Millisecond
			if !adaptive {
				cfg.Engine.AdmissionLatency = 0
			}
			n, err := node.Start(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Stop(context.Background()) })
			cl := nodetest.ClientOf(n, 1024)
			nodetest.WaitFor(t, 10*time.Second, "node ready", func() bool { code, _ := nodetest.Call(t, cl, "GET", "/readyz", ""); return code == 200 })
			if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/slow", `{"total":100000}`); code != 201 {
				t.Fatalf("create sale: %d %v", code, body)
			}
			answers := openLoad(cl, "slow", rate, total)
			byCode := map[string]int{}
			var admitted []time.Duration
			won := map[string]bool{}
			for _, a := range answers {
				key := fmt.Sprint(a.code)
				if a.errCode != "" {
					key += " " + a.errCode
				}
				byCode[key]++
				if a.code == 200 {
					admitted = append(admitted, a.took)
					if won[a.order] {
						t.Fatalf("order %s given twice", a.order)
					}
					won[a.order] = true
				}
			}
			slices.Sort(admitted)
			q := func(p float64) time.Duration {
				if len(admitted) == 0 {
					return 0
				}
				return admitted[min(len(admitted)-1, int(p*float64(len(admitted))))]
			}
			t.Logf("adaptive %v: answers %v; admitted p50 %s p99 %s; 429 share %.0f %%", adaptive, byCode,
				q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), 100*float64(byCode["429 rate_limited"])/total)
			timeouts := byCode["504 outcome_unknown"] + byCode["0"]
			if adaptive {
				if byCode["429 rate_limited"] == 0 {
					t.Fatal("no 429: admission did not follow the slow ledger")
				}
				if timeouts > 0 {
					t.Fatalf("%d deducts timed out (504 or no answer) with admission following the ledger", timeouts)
				}
			} else if timeouts == 0 {
				t.Fatal("no deduct timed out without admission: the load did not overload the slowed ledger")
			}
			// The ledger recovers: the same load is admitted again.
			n.Ledger().SetApplyDelay(0)
			if adaptive {
				again := openLoad(cl, "slow", rate, total/2)
				limited := 0
				for i, a := range again {
					if a.code == 429 {
						limited++
					} else if a.code != 200 {
						t.Fatalf("deduct %d after the ledger recovered: %d %s", i, a.code, a.errCode)
					}
					if a.code == 200 {
						won[a.order] = true
					}
				}
				t.Logf("after the ledger recovered: %d of %d got 429", limited, len(again))
				if limited*20 > len(again) {
					t.Fatalf("%d of %d deducts got 429 after the ledger recovered: the bound did not climb back", limited, len(again))
				}
			}
			// Whatever was answered, the ledger holds every acknowledged order once.
			a := nodetest.CheckLedger(t, cl, "slow")
			if a["sold"].(float64) < float64(len(won)) {
				t.Fatalf("%d orders acknowledged, the ledger sold %v", len(won), a["sold"])
			}
		})
	}
}
