package scenario

import (
	"fmt"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A node that has not applied a write yet must not answer as if it never
// happened: a sale made through the leader a moment ago is not "unknown"
// on a follower that trails it, since clients take a 404 as final. Here
// the follower trails for as long as the test wants: every byte to and
// from it is held (nodetest.FaultNet.Stall) while the sale is made.

// stalledFollower starts a cluster, stalls a follower and creates sku
// through the leader, which commits it with the other follower. It
// returns the cluster and the stalled follower's id.
func stalledFollower(t *testing.T, sku string, units int) (*nodetest.Cluster, string) {
	t.Helper()
	c := nodetest.StartCluster(t)
	leader, follower := c.Leader(), c.Follower()
	c.Net.Stall(follower)
	if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create %s: %d %v", sku, code, body)
	}
	if _, _, ok := c.Node(follower).Ledger().SKU(sku); ok {
		t.Fatalf("%s knows %s through a stalled network", follower, sku)
	}
	return c, follower
}

// TestCatchUp_FollowerSellsASaleItHasNotAppliedYet: a deduct for the new
// sale on the trailing follower waits for the follower to catch up and
// wins; it is never told unknown_sku.
func TestCatchUp_FollowerSellsASaleItHasNotAppliedYet(t *testing.T) {
	c, follower := stalledFollower(t, "fresh", 5)
	eng := c.Node(follower).Engine()
	before := eng.MetricsSnapshot().CatchUps
	type answer struct {
		code int
		body map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		code, body := nodetest.CallQuiet(c.Client(follower), "POST", "/v1/skus/fresh/deduct", `{"user":"u1","request_id":"r1"}`)
		done <- answer{code, body}
	}()
	nodetest.WaitFor(t, 10*time.Second, "the deduct to start catching up", func() bool { return eng.MetricsSnapshot().CatchUps > before })
	c.Net.Resume(follower)
	a := <-done
	if a.code != 200 || a.body["sku"] != "fresh" {
		t.Fatalf("deduct on %s for a sale it had not applied: %d %v", follower, a.code, a.body)
	}
	audit := checkClusterLedgers(t, c, "fresh", map[string]bool{a.body["order_id"].(string): true})
	if audit["sold"].(float64)+audit["held"].(float64) != 1 {
		t.Fatalf("one unit won, the ledger says %v", audit)
	}
}

// TestCatchUp_ReadsOnATrailingFollowerNeverSay404 covers the reads: a sale
// and an order that exist are 503 (retry) on a follower that cannot catch
// up, and 200 once it can; a SKU that does not exist is still 404.
func TestCatchUp_ReadsOnATrailingFollowerNeverSay404(t *testing.T) {
	c, follower := stalledFollower(t, "fresh", 5)
	leader := c.Leader()
	code, won := nodetest.Call(t, c.Client(leader), "POST", "/v1/skus/fresh/deduct", `{"user":"u1"}`)
	if code != 200 {
		t.Fatalf("deduct on the leader: %d %v", code, won)
	}
	order := won["order_id"].(string)
	paths := []string{"/v1/skus/fresh", "/v1/orders/" + order, "/v1/skus/fresh/audit"}
	for _, p := range paths {
		// The stalled follower cannot reach the leader: it says so.
		if code, body := nodetest.CallQuiet(c.Client(follower), "GET", p, ""); code != 503 {
			t.Fatalf("GET %s on %s, cut off: %d %v (want 503, never 404)", p, follower, code, body)
		}
	}
	if code, body := nodetest.CallQuiet(c.Client(follower), "POST", "/v1/skus/fresh/deduct", `{"user":"u2"}`); code != 503 {
		t.Fatalf("deduct on %s, cut off: %d %v (want 503, never 404)", follower, code, body)
	}
	c.Net.Resume(follower)
	// Cut off for seconds, it has lost the leader: 503 until it finds it
	// again, then 200; never 404.
	for _, p := range paths {
		nodetest.WaitFor(t, 20*time.Second, "GET "+p+" on the healed follower", func() bool {
			code, body := nodetest.CallQuiet(c.Client(follower), "GET", p, "")
			if code != 200 && code != 503 {
				t.Fatalf("GET %s on %s, healing: %d %v", p, follower, code, body)
			}
			return code == 200
		})
	}
	for _, p := range []string{"/v1/skus/never", "/v1/orders/n9-never"} {
		if code, body := nodetest.Call(t, c.Client(follower), "GET", p, ""); code != 404 {
			t.Fatalf("GET %s: %d %v (want 404)", p, code, body)
		}
	}
	checkClusterLedgers(t, c, "fresh", map[string]bool{order: true})
}

// TestCatchUp_MissesShareRounds: misses do not cost the leader one read
// index each. A batch's unknown SKUs share one round; concurrent misses
// share rounds too.
func TestCatchUp_MissesShareRounds(t *testing.T) {
	c := nodetest.StartCluster(t)
	createSaleEverywhere(t, c, "real", 100)
	follower := c.Follower()
	eng := c.Node(follower).Engine()
	before := eng.MetricsSnapshot()
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"ghost-%d","user":"u%d"}`, i, i)
	}
	items[50] = `{"sku":"real","user":"buyer"}`
	code, results, raw := postBatch(t, c.Client(follower), `{"deducts":[`+strings.Join(items, ",")+`]}`)
	if code != 200 {
		t.Fatalf("batch: %d %s", code, raw)
	}
	for i, r := range results {
		want := "unknown_sku"
		if i == 50 {
			want = ""
		}
		if r.Error != want {
			t.Fatalf("item %d: %+v (want error %q)", i, r, want)
		}
	}
	after := eng.MetricsSnapshot()
	if rounds := after.CatchUpRounds - before.CatchUpRounds; rounds != 1 {
		t.Fatalf("a batch of 99 unknown SKUs took %d read indexes, want 1", rounds)
	}

	const workers, each = 32, 8
	var wg sync.WaitGroup
	codes := make([]int, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				codes[w*each+i], _ = nodetest.CallQuiet(c.Client(follower), "POST", fmt.Sprintf("/v1/skus/ghost-%d-%d/deduct", w, i), `{"user":"u"}`)
			}
		})
	}
	wg.Wait()
	for i, code := range codes {
		if code != 404 {
			t.Fatalf("miss %d: %d, want 404", i, code)
		}
	}
	last := eng.MetricsSnapshot()
	misses, rounds := last.CatchUps-after.CatchUps, last.CatchUpRounds-after.CatchUpRounds
	if misses != workers*each || rounds > misses/2 {
		t.Fatalf("%d concurrent misses took %d read indexes (want at most half)", misses, rounds)
	}
	t.Logf("%d concurrent misses, %d read indexes", misses, rounds)
	checkClusterLedgers(t, c, "real", nil)
}
