package scenario

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"

	"github.com/valyala/fasthttp"
)

// buyerResult is the last answer a buyer got.
type buyerResult struct {
	code    int
	errCode string
	order   string
}

// buyWave sends one deduct per buyer in [from, to), spread over the nodes,
// from workers goroutines. A buyer whose answer is not final (no node
// reachable, 503, 504) retries with the same request_id on the next node,
// a bounded number of times.
func buyWave(sc nodetest.SalesCluster, sku string, from, to, workers int, acked *atomic.Int64) map[int]buyerResult {
	ids := sc.NodeIDs()
	var mu sync.Mutex
	results := map[int]buyerResult{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for b := from + w; b < to; b += workers {
				body := fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b)
				var res buyerResult
				for attempt := 0; attempt < 60; attempt++ {
					cl := sc.Client(ids[(b+attempt)%len(ids)])
					if cl == nil {
						continue
					}
					code, out := nodetest.CallQuiet(cl, "POST", "/v1/skus/"+sku+"/deduct", body)
					res = buyerResult{code: code}
					if out != nil {
						res.errCode, _ = out["error"].(string)
						res.order, _ = out["order_id"].(string)
					}
					if code == 200 || (code == 409 && res.errCode == "sold_out") {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if res.code == 200 && acked != nil {
					acked.Add(1)
				}
				mu.Lock()
				results[b] = res
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	return results
}

// checkClusterLedgers waits until every node has applied the same index,
// then asserts that their ledgers are identical, obey the conservation law,
// and hold every acknowledged order; it returns the common audit.
func checkClusterLedgers(t *testing.T, sc nodetest.SalesCluster, sku string, acked map[string]bool) map[string]any {
	t.Helper()
	ids := sc.NodeIDs()
	var audits map[string]map[string]any
	nodetest.WaitFor(t, 20*time.Second, "all nodes at the same applied index", func() bool {
		audits = map[string]map[string]any{}
		var index float64 = -1
		for _, id := range ids {
			code, a := nodetest.Call(t, sc.Client(id), "GET", "/v1/skus/"+sku+"/audit", "")
			if code != 200 {
				return false
			}
			audits[id] = a
			if index >= 0 && a["applied_index"].(float64) != index {
				return false
			}
			index = a["applied_index"].(float64)
		}
		return true
	})
	ref := audits[ids[0]]
	for _, id := range ids {
		a := audits[id]
		if a["ok"] != true {
			t.Fatalf("%s: audit failed: %v", id, a)
		}
		nodetest.CheckLedger(t, sc.Client(id), sku) // conservation law, recomputed here
		for _, k := range []string{"total", "available", "held", "sold", "orders"} {
			if a[k] != ref[k] {
				t.Fatalf("ledgers differ on %s: %s has %v, %s has %v", k, id, a[k], ids[0], ref[k])
			}
		}
		if fmt.Sprint(a["leased"]) != fmt.Sprint(ref["leased"]) {
			t.Fatalf("ledgers differ on leased: %s %v, %s %v", id, a["leased"], ids[0], ref["leased"])
		}
	}
	checkOrdersEverywhere(t, sc, acked)
	checkFeedEverywhere(t, sc, sku, ref)
	return ref
}

// ackedOrders collects the orders buyers were told they won, failing on a
// buyer with two orders or an order given to two buyers.
func ackedOrders(t *testing.T, waves ...map[int]buyerResult) map[string]bool {
	t.Helper()
	byBuyer := map[int]string{}
	orders := map[string]int{}
	for _, wave := range waves {
		for b, r := range wave {
			if r.code != 200 {
				continue
			}
			if prev, ok := byBuyer[b]; ok && prev != r.order {
				t.Fatalf("buyer %d acknowledged twice: %s and %s", b, prev, r.order)
			}
			if other, ok := orders[r.order]; ok && other != b {
				t.Fatalf("order %s acknowledged to buyers %d and %d", r.order, other, b)
			}
			byBuyer[b], orders[r.order] = r.order, b
		}
	}
	acked := map[string]bool{}
	for o := range orders {
		acked[o] = true
	}
	return acked
}

// sellOut runs the cluster's sale to its end: once leases left idle have
// come back, buyers on every node take what is left, so nothing can stay
// stranded on one node.
func sellOut(t *testing.T, sc nodetest.SalesCluster, sku string, units, firstBuyer int) map[int]buyerResult {
	t.Helper()
	all := map[int]buyerResult{}
	next := firstBuyer
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, a := nodetest.Call(t, sc.Client(sc.NodeIDs()[0]), "GET", "/v1/skus/"+sku+"/audit", "")
		if a["sold"].(float64)+a["held"].(float64) >= float64(units) {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("stock still unsold after the idle period: %v", a)
		}
		for b, r := range buyWave(sc, sku, next, next+300, 6, nil) {
			all[b] = r
		}
		next += 300
	}
}

func testClusterSale(t *testing.T, fault func(c *nodetest.Cluster, acked *atomic.Int64)) {
	const units, buyers = 5000, 8000
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	if code, body := nodetest.Call(t, c.Client(c.IDs[0]), "PUT", "/v1/skus/tv", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale through %s (leader %s): %d %v", c.IDs[0], leader, code, body)
	}
	// The first buyers arrive in a calm cluster; the fault strikes while
	// the rest are mid-request.
	var ackCount atomic.Int64
	const calm = 1500
	first := buyWave(c, "tv", 0, calm, 24, &ackCount)
	waveDone := make(chan map[int]buyerResult, 1)
	go func() { waveDone <- buyWave(c, "tv", calm, buyers, 24, &ackCount) }()
	fault(c, &ackCount)
	second := <-waveDone
	for b, r := range second {
		first[b] = r
	}
	nodetest.WaitReady(t, c)
	rest := sellOut(t, c, "tv", units, buyers)

	acked := ackedOrders(t, first, rest)
	if len(acked) > units {
		t.Fatalf("oversold: %d orders acknowledged for %d units", len(acked), units)
	}
	a := checkClusterLedgers(t, c, "tv", acked)
	if a["sold"].(float64)+a["held"].(float64) != units || a["orders"].(float64) != units {
		t.Fatalf("after sell-out: %v", a)
	}
	t.Logf("acknowledged %d of %d units in the first wave, %d after", len(ackedOrders(t, first)), units, len(acked)-len(ackedOrders(t, first)))
}

func TestCluster_LeaderStoppedAndRestartedMidSale(t *testing.T) {
	testClusterSale(t, func(c *nodetest.Cluster, acked *atomic.Int64) {
		leader := c.Leader()
		if leader == "" {
			t.Error("no leader mid-sale")
			return
		}
		c.Crash(leader)
		t.Logf("crashed leader %s after %d acknowledgements", leader, acked.Load())
		at := acked.Load()
		nodetest.WaitFor(t, 30*time.Second, "sales go on without the old leader", func() bool { return acked.Load() >= at+300 })
		c.Start(leader, nil)
		t.Logf("restarted %s after %d acknowledgements", leader, acked.Load())
	})
}

func TestCluster_FollowerPartitionedAndHealedMidSale(t *testing.T) {
	testClusterSale(t, func(c *nodetest.Cluster, acked *atomic.Int64) {
		leader := c.Leader()
		var follower string
		for _, id := range c.IDs {
			if id != leader {
				follower = id
				break
			}
		}
		c.Net.Isolate(follower)
		t.Logf("isolated follower %s after %d acknowledgements", follower, acked.Load())
		// Cut off from the quorum, it refuses wait=commit deducts at once
		// (503, not a 504 after a commit wait) and still answers reads.
		probe := 0
		nodetest.WaitFor(t, 10*time.Second, "the isolated follower's breaker open", func() bool {
			probe++
			code, body := nodetest.CallQuiet(c.Client(follower), "POST", "/v1/skus/tv/deduct", fmt.Sprintf(`{"user":"cut-off-%d","request_id":"cut-off-%d"}`, probe, probe))
			return code == 503 && body["error"] == "unavailable"
		})
		if code, sku := nodetest.CallQuiet(c.Client(follower), "GET", "/v1/skus/tv", ""); code != 200 || sku["stale"] != true {
			t.Errorf("read on the isolated follower: %d %v, want 200 and stale", code, sku)
		}
		// Stay cut off past the reclaim deadline, so the leader takes the
		// follower's leases back while the others keep selling.
		nodetest.WaitFor(t, 30*time.Second, "the leader reclaims the follower's leases", func() bool {
			l := c.Leader()
			if l == "" {
				return false
			}
			_, a := nodetest.Call(t, c.Client(l), "GET", "/v1/skus/tv/audit", "")
			leased, _ := a["leased"].(map[string]any)
			return leased[follower] == nil
		})
		c.Net.Heal(follower)
		t.Logf("healed %s after %d acknowledgements", follower, acked.Load())
	})
}

// TestCluster_StrandedStockComesBack leaves units leased to a node no buyer
// visits and checks that buyers on the other nodes get them once the idle
// period has passed.
func TestCluster_StrandedStockComesBack(t *testing.T) {
	c := nodetest.StartCluster(t)
	const units = 200
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/lamp", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitFor(t, 10*time.Second, "the sale visible on n3", func() bool {
		code, _ := nodetest.Call(t, c.Client("n3"), "GET", "/v1/skus/lamp", "")
		return code == 200
	})
	// One purchase on n3 makes it lease a chunk; nobody buys there again.
	if code, body := nodetest.Call(t, c.Client("n3"), "POST", "/v1/skus/lamp/deduct", `{"user":"early","request_id":"early"}`); code != 200 {
		t.Fatalf("deduct on n3: %d %v", code, body)
	}
	leasedAt := time.Now()
	var returnedAfter atomic.Int64
	go func() {
		for time.Since(leasedAt) < 20*time.Second {
			code, a := nodetest.CallQuiet(c.Client("n1"), "GET", "/v1/skus/lamp/audit", "")
			if leased, _ := a["leased"].(map[string]any); code == 200 && leased["n3"] == nil {
				returnedAfter.Store(int64(time.Since(leasedAt)))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	// Buyers on n1 and n2 only, many at once, each retrying at a buyer's
	// pace while it is told sold_out, a bounded number of times.
	var sold atomic.Int64
	sold.Add(1)
	var longestSoldOutRun atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var soldOutSince time.Time
			for try := 0; try < 500 && sold.Load() < units; try++ {
				b := w*1000 + try
				node := []string{"n1", "n2"}[b%2]
				code, body := nodetest.CallQuiet(c.Client(node), "POST", "/v1/skus/lamp/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"s%d"}`, b, b))
				switch {
				case code == 200:
					sold.Add(1)
					if !soldOutSince.IsZero() {
						d := int64(time.Since(soldOutSince))
						for old := longestSoldOutRun.Load(); d > old && !longestSoldOutRun.CompareAndSwap(old, d); old = longestSoldOutRun.Load() {
						}
					}
					soldOutSince = time.Time{}
				case code == 409 && body["error"] == "sold_out":
					if soldOutSince.IsZero() {
						soldOutSince = time.Now()
					}
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("deduct on %s: %d %v", node, code, body)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if sold.Load() != units {
		t.Fatalf("sold %d of %d: stock stayed stranded", sold.Load(), units)
	}
	a := checkClusterLedgers(t, c, "lamp", nil)
	if a["sold"].(float64) != units {
		t.Fatalf("ledger: %v", a)
	}
	t.Logf("n3's idle lease went back after %s; longest run of sold_out answers a buyer saw before winning: %s (lease idle return %s)",
		time.Duration(returnedAfter.Load()).Round(time.Millisecond), time.Duration(longestSoldOutRun.Load()).Round(time.Millisecond), nodetest.LeaseIdleReturn)
}

// TestCluster_RemoveAndJoin removes a follower that holds a lease (its
// units go back to available at once) and adds a new node with -join.
func TestCluster_RemoveAndJoin(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	var followers []string
	for _, id := range c.IDs {
		if id != leader {
			followers = append(followers, id)
		}
	}
	victim, via := followers[0], followers[1]
	if code, body := nodetest.Call(t, c.Client(via), "PUT", "/v1/skus/desk", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitFor(t, 10*time.Second, "the sale visible on "+victim, func() bool {
		code, _ := nodetest.Call(t, c.Client(victim), "GET", "/v1/skus/desk", "")
		return code == 200
	})
	if code, body := nodetest.Call(t, c.Client(victim), "POST", "/v1/skus/desk/deduct", `{"user":"a","request_id":"a"}`); code != 200 {
		t.Fatalf("deduct on %s: %d %v", victim, code, body)
	}
	// Remove the victim through the other follower: the call is relayed
	// to the leader.
	code, body := nodetest.Call(t, c.Client(via), "DELETE", "/v1/cluster/nodes/"+victim, "")
	if code != 200 {
		t.Fatalf("remove %s via %s: %d %v", victim, via, code, body)
	}
	_, a := nodetest.Call(t, c.Client(leader), "GET", "/v1/skus/desk/audit", "")
	if leased, _ := a["leased"].(map[string]any); leased[victim] != nil {
		t.Fatalf("%s still holds a lease after removal: %v", victim, a)
	}
	c.Crash(victim)

	// A new node joins through a member's URL.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.IDs = []string{leader, via, "n4"}
	c.Dirs["n4"], c.RaftAddr["n4"] = t.TempDir(), ln.Addr().String()
	c.Net.Own(c.RaftAddr["n4"], "n4")
	joinVia := "http://" + c.Node(via).HTTPAddr()
	c.StartWith("n4", ln, func(cfg *node.Config) { cfg.Peers, cfg.Join = nil, joinVia })
	nodetest.WaitReady(t, c)
	_, st := nodetest.Call(t, c.Client("n4"), "GET", "/v1/cluster", "")
	members := map[string]bool{}
	for _, n := range st["nodes"].([]any) {
		members[n.(map[string]any)["id"].(string)] = true
	}
	if len(members) != 3 || !members[leader] || !members[via] || !members["n4"] {
		t.Fatalf("members after remove and join: %v", members)
	}
	if code, body := nodetest.Call(t, c.Client("n4"), "POST", "/v1/skus/desk/deduct", `{"user":"b","request_id":"b"}`); code != 200 {
		t.Fatalf("deduct on the joined node: %d %v", code, body)
	}
	a = checkClusterLedgers(t, c, "desk", nil)
	if a["sold"].(float64) != 2 {
		t.Fatalf("ledger: %v", a)
	}
}

// TestCluster_PerUserLimitUnderARace sends one user's concurrent deducts,
// with distinct request ids, to all three nodes: the limit holds exactly.
func TestCluster_PerUserLimitUnderARace(t *testing.T) {
	c := nodetest.StartCluster(t)
	for _, limit := range []int{1, 2} {
		sku := fmt.Sprintf("limited-%d", limit)
		if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":100,"per_user":%d}`, limit)); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
		waitForSaleEverywhere(t, c, sku)
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[string]int{}
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				node := c.IDs[i%len(c.IDs)]
				code, body := nodetest.Call(t, c.Client(node), "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"alice","request_id":"%s-%d"}`, sku, i))
				mu.Lock()
				outcomes[fmt.Sprintf("%d %v", code, body["error"])]++
				mu.Unlock()
			}(i)
		}
		wg.Wait()
		if outcomes["200 <nil>"] != limit || outcomes["409 user_limit"] != 50-limit {
			t.Fatalf("per_user=%d: outcomes %v, want %d × 200 and the rest 409 user_limit", limit, outcomes, limit)
		}
		a := checkClusterLedgers(t, c, sku, nil)
		if a["sold"].(float64) != float64(limit) {
			t.Fatalf("per_user=%d: ledger %v", limit, a)
		}
	}
}

func waitForSaleEverywhere(t *testing.T, c *nodetest.Cluster, sku string) {
	t.Helper()
	nodetest.WaitFor(t, 10*time.Second, "sale "+sku+" on every node", func() bool {
		for _, id := range c.IDs {
			if code, _ := nodetest.Call(t, c.Client(id), "GET", "/v1/skus/"+sku, ""); code != 200 {
				return false
			}
		}
		return true
	})
}

// TestCluster_HoldsExpireThroughALeaderCrash runs a sale with a 2 s hold:
// half the first winners pay, the others never do; their units expire and
// go to later buyers, who pay at once. The leader is killed just as the
// first holds expire. At the end every unit is sold to a buyer who paid.
func TestCluster_HoldsExpireThroughALeaderCrash(t *testing.T) {
	const units, holdTTL = 200, 2 * time.Second
	c := nodetest.StartCluster(t)
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/shoe", fmt.Sprintf(`{"total":%d,"hold_ttl":"%s"}`, units, holdTTL)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "shoe")
	start := time.Now()
	first := buyWave(c, "shoe", 0, 300, 12, nil)
	var confirmed atomic.Int64
	confirm := func(order string, node string) {
		for attempt := 0; attempt < 40; attempt++ {
			cl := c.Client(c.IDs[(attempt+int(node[1]))%len(c.IDs)])
			if cl == nil {
				continue
			}
			code, body := nodetest.CallQuiet(cl, "POST", "/v1/orders/"+order+"/confirm", "")
			switch {
			case code == 200 && body["state"] == "sold":
				confirmed.Add(1)
				return
			case code == 409:
				return // expired: the buyer was too slow
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("confirm %s: no final answer", order)
	}
	n := 0
	for _, r := range first {
		if r.code == 200 {
			n++
			if n%2 == 0 {
				confirm(r.order, "n1")
			}
		}
	}
	if n != units {
		t.Fatalf("first wave held %d units, want all %d", n, units)
	}
	// Kill the leader just as the first holds come due, and bring it back.
	time.Sleep(time.Until(start.Add(holdTTL - 100*time.Millisecond)))
	leader := c.Leader()
	c.Crash(leader)
	nodetest.WaitFor(t, 10*time.Second, "a new leader", func() bool { return c.Leader() != "" })
	c.Start(leader, nil)
	nodetest.WaitReady(t, c)

	// Later buyers take the expired units and pay at once.
	next := 1000
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, a := nodetest.Call(t, c.Client("n1"), "GET", "/v1/skus/shoe/audit", "")
		if a["sold"].(float64) == units {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every unit sold: %v", a)
		}
		for _, r := range buyWave(c, "shoe", next, next+100, 8, nil) {
			if r.code == 200 {
				confirm(r.order, "n2")
			}
		}
		next += 100
	}
	a := checkClusterLedgers(t, c, "shoe", nil)
	leased := 0.0
	for _, v := range a["leased"].(map[string]any) {
		leased += v.(float64)
	}
	if a["sold"].(float64) != float64(confirmed.Load()) || a["held"].(float64) != 0 || a["available"].(float64)+leased+a["sold"].(float64) != units {
		t.Fatalf("confirmed %d; ledger %v", confirmed.Load(), a)
	}
}

// TestCluster_RequestIDReplayedAfterFailover buys through a follower, kills
// the leader, and replays the same request id on every node.
func TestCluster_RequestIDReplayedAfterFailover(t *testing.T) {
	c := nodetest.StartCluster(t)
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/cup", `{"total":10}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "cup")
	leader := c.Leader()
	var follower string
	for _, id := range c.IDs {
		if id != leader {
			follower = id
		}
	}
	code, first := nodetest.Call(t, c.Client(follower), "POST", "/v1/skus/cup/deduct", `{"user":"bob","request_id":"bob-1"}`)
	if code != 200 {
		t.Fatalf("deduct: %d %v", code, first)
	}
	c.Crash(leader)
	nodetest.WaitFor(t, 10*time.Second, "a new leader", func() bool { return c.Leader() != "" })
	c.Start(leader, nil)
	nodetest.WaitReady(t, c)
	for _, id := range c.IDs {
		code, again := nodetest.Call(t, c.Client(id), "POST", "/v1/skus/cup/deduct", `{"user":"bob","request_id":"bob-1"}`)
		if code != 200 || again["order_id"] != first["order_id"] {
			t.Fatalf("replay on %s: %d %v, want the original order %v", id, code, again, first["order_id"])
		}
	}
	if a := checkClusterLedgers(t, c, "cup", nil); a["sold"].(float64) != 1 {
		t.Fatalf("ledger: %v", a)
	}
}

func TestCluster_ForwardedBatchFarOver16KiBCommits(t *testing.T) {
	const takes = 2000
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	follower := c.IDs[0]
	if follower == leader {
		follower = c.IDs[1]
	}
	if code, body := nodetest.Call(t, c.Client(follower), "PUT", "/v1/skus/big", fmt.Sprintf(`{"total":%d}`, takes)); code != 201 {
		t.Fatalf("create sale through %s: %d %v", follower, code, body)
	}
	p := c.Node(follower).Proposer()
	at := time.Now().UnixNano()
	if res, err := p.Propose(at, &command.Lease{Node: follower, SKU: "big", Want: takes}); err != nil || res.Qty != takes {
		t.Fatalf("lease: %v %+v", err, res)
	}
	take := &command.Take{Node: follower}
	long := strings.Repeat("x", 100)
	for i := range takes {
		take.Entries = append(take.Entries, command.TakeEntry{SKU: "big", Qty: 1,
			User: fmt.Sprintf("%s-u%d", long, i), RequestID: fmt.Sprintf("%s-r%d", long, i), OrderID: fmt.Sprintf("%s-big-%d", follower, i)})
	}
	if size := len(command.EncodeCommand(nil, at, take)); size < 20*httpapi.MaxBodyBytes {
		t.Fatalf("the batch is only %d bytes", size)
	}
	res, err := p.Propose(at, take)
	if err != nil {
		t.Fatalf("forward a %d-take batch from %s to %s: %v", takes, follower, leader, err)
	}
	for i, r := range res.Takes {
		if r.Outcome != stock.OutcomeOK {
			t.Fatalf("take %d: %s", i, r.Outcome)
		}
	}
	a := checkClusterLedgers(t, c, "big", map[string]bool{take.Entries[0].OrderID: true, take.Entries[takes-1].OrderID: true})
	if a["sold"].(float64) != takes {
		t.Fatalf("sold %v, want %d", a["sold"], takes)
	}
}

// proposeAs sends an encoded command to node to's internal route as node
// from would, with the given cluster secret.
func proposeAs(t *testing.T, c *nodetest.Cluster, to, from, secret string, cmd command.Command) (int, string) {
	t.Helper()
	headers := map[string]string{"X-Stockd-Node": from}
	if secret != "" {
		headers["X-Stockd-Cluster-Secret"] = secret
	}
	return postCommand(t, c.Client(to), c.Node(to).HTTPAddr(), command.EncodeCommand(nil, time.Now().UnixNano(), cmd), headers)
}

// postCommand posts an encoded command to addr's /internal/v1/propose
// through hc, with headers.
func postCommand(t *testing.T, hc *fasthttp.HostClient, addr string, cmd []byte, headers map[string]string) (int, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/internal/v1/propose") // the node port: TLS is in the dial
	req.Header.SetMethod("POST")
	req.Header.Set("X-Stockd-Wire", "1")
	req.Header.SetContentType("application/x-stockd-command")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.SetBody(cmd)
	if err := hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode(), string(resp.Body())
}

func TestCluster_PeerCannotWriteInAnotherNodesName(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	var follower, other string
	for _, id := range c.IDs {
		switch {
		case id == leader:
		case follower == "":
			follower = id
		default:
			other = id
		}
	}
	if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/gem", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "gem")
	// The other node holds a lease a forged take could spend.
	if code, body := nodetest.Call(t, c.Client(other), "POST", "/v1/skus/gem/deduct", `{"user":"real","request_id":"real"}`); code != 200 {
		t.Fatalf("deduct on %s: %d %v", other, code, body)
	}
	before := checkClusterLedgers(t, c, "gem", nil)
	f := func(name string, secret string, cmd command.Command, wantCode int) {
		t.Helper()
		code, body := proposeAs(t, c, leader, follower, secret, cmd)
		if code != wantCode {
			t.Fatalf("%s: %d %s, want %d", name, code, body, wantCode)
		}
	}
	forged := &command.Take{Node: other, Entries: []command.TakeEntry{{SKU: "gem", Qty: 1, User: "thief", OrderID: other + "-forged"}}}
	f("take in another node's name", nodetest.ClusterSecret, forged, 403)
	f("lease in another node's name", nodetest.ClusterSecret, &command.Lease{Node: other, SKU: "gem", Want: 50}, 403)
	f("return in another node's name", nodetest.ClusterSecret, &command.Return{Node: other, SKU: "gem", Qty: 1}, 403)
	f("restock from a peer", nodetest.ClusterSecret, &command.Restock{SKU: "gem", Qty: 1000}, 403)
	f("reclaim from a peer", nodetest.ClusterSecret, &command.Reclaim{Node: other}, 403)
	f("take with a wrong secret", "wrong", &command.Take{Node: follower, Entries: forged.Entries}, 403)
	f("take without a secret", "", &command.Take{Node: follower, Entries: forged.Entries}, 403)
	after := checkClusterLedgers(t, c, "gem", nil)
	for _, k := range []string{"total", "available", "held", "sold", "orders"} {
		if before[k] != after[k] {
			t.Fatalf("a refused call changed %s: %v -> %v", k, before[k], after[k])
		}
	}
	if fmt.Sprint(before["leased"]) != fmt.Sprint(after["leased"]) {
		t.Fatalf("a refused call changed leases: %v -> %v", before["leased"], after["leased"])
	}
	// Its own registration, in its own name, is what a peer may send.
	f("own registration", nodetest.ClusterSecret, &command.Register{Node: follower, Addr: c.Node(follower).HTTPAddr()}, 200)
}

// answerLoser is a peer connection that, while lose is set, loses every
// answer: what a relay sees when the leader applies a call and dies, or
// the network fails, before the answer comes back.
type answerLoser struct {
	net.Conn
	lose *atomic.Bool
}

func (c answerLoser) Read(p []byte) (int, error) {
	if c.lose.Load() {
		c.Conn.Close()
		return 0, fmt.Errorf("answer lost by the test")
	}
	return c.Conn.Read(p)
}

// TestCluster_RelayedConfirmWithALostAnswerIsOutcomeUnknown: a follower
// relays a confirm to the leader, which applies it, and the answer is
// lost. The follower used to answer 503 unavailable, which tells the
// caller nothing happened; the order was sold. It must answer 504
// outcome_unknown, and a retry must find the order sold.
func TestCluster_RelayedConfirmWithALostAnswerIsOutcomeUnknown(t *testing.T) {
	var lose atomic.Bool
	c := nodetest.StartClusterWith(t, func(cfg *node.Config) {
		dial := cfg.PeerDial
		cfg.PeerDial = func(addr string) (net.Conn, error) {
			conn, err := dial(addr)
			if err != nil {
				return nil, err
			}
			return answerLoser{Conn: conn, lose: &lose}, nil
		}
	})
	leader := c.Leader()
	follower := c.IDs[0]
	if follower == leader {
		follower = c.IDs[1]
	}
	if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/lamp", `{"total":10,"hold_ttl":"1m"}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "lamp")
	code, out := nodetest.Call(t, c.Client(follower), "POST", "/v1/skus/lamp/deduct", `{"user":"a","request_id":"a"}`)
	if code != 200 || out["state"] != "held" {
		t.Fatalf("hold on %s: %d %v", follower, code, out)
	}
	order := out["order_id"].(string)

	lose.Store(true)
	code, out = nodetest.CallQuiet(c.Client(follower), "POST", "/v1/orders/"+order+"/confirm", "")
	lose.Store(false)
	if code != 504 || out["error"] != "outcome_unknown" {
		t.Fatalf("confirm relayed with its answer lost: %d %v, want 504 outcome_unknown", code, out)
	}
	// The leader got the confirm and applies it whatever became of the
	// answer.
	nodetest.WaitFor(t, 10*time.Second, "the order sold on the leader", func() bool {
		_, o := nodetest.Call(t, c.Client(leader), "GET", "/v1/orders/"+order, "")
		return o["state"] == "sold"
	})
	if code, o := nodetest.Call(t, c.Client(follower), "POST", "/v1/orders/"+order+"/confirm", ""); code != 200 || o["state"] != "sold" {
		t.Fatalf("confirm retried: %d %v", code, o)
	}
	a := checkClusterLedgers(t, c, "lamp", map[string]bool{order: true})
	if a["sold"] != 1.0 || a["held"] != 0.0 {
		t.Fatalf("ledger: %v", a)
	}
}
