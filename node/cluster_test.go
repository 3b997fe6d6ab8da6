package node_test

import (
	"fmt"
	"testing"
	"time"

	"stockd.dev/stockd/node/nodetest"
)

// TestCluster_AFollowerForwardsAndTheLeaderDiesMidSale: three nodes over
// the test harness's network. Deducts sent to a follower are forwarded to
// the leader; the leader crashes mid-sale and comes back on its data dir.
// Every order a buyer was told about is on every node, each once, and the
// ledger's law holds everywhere.
func TestCluster_AFollowerForwardsAndTheLeaderDiesMidSale(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader, follower := c.Leader(), c.Follower()
	if code, body := nodetest.Call(t, c.Client(follower), "PUT", "/v1/skus/mug", `{"total":40}`); code != 201 {
		t.Fatalf("create through a follower: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "mug")
	acked := map[string]int{} // order id -> buyer
	buy := func(via string, from, to int) {
		for b := from; b < to; b++ {
			code, body := nodetest.CallQuiet(c.Client(via), "POST", "/v1/skus/mug/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, b, b))
			if code != 200 {
				continue // 503 while the cluster elects; the buyer may retry
			}
			id := body["order_id"].(string)
			if prev, ok := acked[id]; ok && prev != b {
				t.Fatalf("order %s given to buyers %d and %d", id, prev, b)
			}
			acked[id] = b
		}
	}
	buy(follower, 0, 15)
	c.Crash(leader)
	nodetest.WaitFor(t, 20*time.Second, "a new leader", func() bool { l := c.Leader(); return l != "" && l != leader })
	buy(follower, 15, 30)
	c.Start(leader, nil)
	nodetest.WaitReady(t, c)
	buy(leader, 30, 50)
	if len(acked) < 15 || len(acked) > 40 {
		t.Fatalf("%d orders acknowledged of 40 units for 50 buyers", len(acked))
	}
	var sold []float64
	nodetest.WaitFor(t, 20*time.Second, "every node at the same count", func() bool {
		sold = sold[:0]
		for _, id := range c.NodeIDs() {
			_, a := nodetest.CallQuiet(c.Client(id), "GET", "/v1/skus/mug/audit", "")
			if a == nil {
				return false
			}
			sold = append(sold, a["sold"].(float64))
		}
		return sold[0] == sold[1] && sold[1] == sold[2] && sold[0] >= float64(len(acked))
	})
	for _, id := range c.NodeIDs() {
		nodetest.CheckLedger(t, c.Client(id), "mug")
		for order := range acked {
			if code, body := nodetest.CallQuiet(c.Client(id), "GET", "/v1/orders/"+order, ""); code != 200 || body["state"] != "sold" {
				t.Fatalf("acknowledged order %s on %s: %d %v", order, id, code, body)
			}
		}
	}
}
