package scenario

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// The end of a sale, where answers must stay true (docs/architecture.md, "True
// answers at the end of a sale"): many more buyers than units, a share of
// request ids sent twice at once (to the same node or another), and the
// checks that no request id is answered both a win and a loss, that no
// deduct starting after a sold_out answer wins, and that nothing is
// oversold or left unsold.

// tailSale sizes one sale.
type tailSale struct {
	sku           string
	units         int
	buyers        int
	conns         int
	attempts      int // request ids per buyer (each its own deduct)
	perUser       int // the sale's per_user limit, 0: none
	resendPercent int // share of request ids sent twice at once
	// midSale, when set, runs once 90 % of the units are sold, while
	// buyers keep coming.
	midSale func()
}

// tailAnswer is the final answer to one request id on one call: a win
// (200), or a loss (409 sold_out or user_limit). start is when the first
// try of that call began.
type tailAnswer struct {
	reqID      string
	buyer      int
	start, end time.Time
	code       int
	errCode    string
	order      string
}

func (a tailAnswer) won() bool  { return a.code == 200 }
func (a tailAnswer) lost() bool { return a.code == 409 }

// tailClients is one pool per node, sized for the sale's connections.
type tailClients struct {
	sc   nodetest.SalesCluster
	mu   sync.Mutex
	pool map[string]*fasthttp.HostClient
}

func (tc *tailClients) get(id string, conns int) *fasthttp.HostClient {
	base := tc.sc.Client(id)
	if base == nil {
		return nil
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if c, ok := tc.pool[id]; ok && c.Addr == base.Addr {
		return c
	}
	c := &fasthttp.HostClient{Addr: base.Addr, MaxConns: conns, ReadTimeout: 20 * time.Second, WriteTimeout: 5 * time.Second}
	tc.pool[id] = c
	return c
}

// tailDeduct sends one request id until it gets a final answer: on 429 it
// comes back after Retry-After (at most a second), on 5xx or a transport
// error it tries the next node, a bounded number of times.
func tailDeduct(tc *tailClients, ids []string, first int, conns int, sku string, buyer int, user, reqID string) (tailAnswer, bool) {
	body := fmt.Sprintf(`{"user":%q,"qty":1,"request_id":%q}`, user, reqID)
	ans := tailAnswer{reqID: reqID, buyer: buyer, start: time.Now()}
	node := first
	for try := 0; try < 80; try++ {
		c := tc.get(ids[node%len(ids)], conns)
		if c == nil {
			node++
			continue
		}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + c.Addr + "/v1/skus/" + sku + "/deduct")
		req.Header.SetMethod("POST")
		req.SetBodyString(body)
		err := c.DoTimeout(req, resp, 20*time.Second)
		code, retryAfter := resp.StatusCode(), string(resp.Header.Peek("Retry-After"))
		var out map[string]any
		_ = jsonUnmarshal(resp.Body(), &out)
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		switch {
		case err != nil || code >= 500:
			node++
			time.Sleep(50 * time.Millisecond) // back off before the next node
			continue
		case code == 429:
			pause := time.Second
			if secs, err := strconv.Atoi(retryAfter); err == nil && secs > 0 {
				pause = min(time.Duration(secs)*time.Second, pause)
			}
			time.Sleep(pause) // as Retry-After asks
			continue
		}
		ans.end, ans.code = time.Now(), code
		ans.errCode, _ = out["error"].(string)
		ans.order, _ = out["order_id"].(string)
		return ans, true
	}
	return ans, false
}

// resent says whether a request id is sent twice (stable per id).
func resent(reqID string, percent int) bool {
	h := fnv.New32a()
	h.Write([]byte(reqID))
	return int(h.Sum32()%100) < percent
}

// runTailSale creates the sale, runs it over sc's nodes and checks what
// its buyers were told. It returns every final answer.
func runTailSale(t *testing.T, sc nodetest.SalesCluster, o tailSale) []tailAnswer {
	t.Helper()
	return runTailSaleWith(t, sc, sc, o, true)
}

// runTailSaleWith runs the sale with buyers on buyerNodes' nodes only and
// checks it on every node of all; create says whether to create the sale
// first.
func runTailSaleWith(t *testing.T, buyerNodes, all nodetest.SalesCluster, o tailSale, create bool) []tailAnswer {
	t.Helper()
	sc := all
	if create {
		admin := ""
		for _, id := range all.NodeIDs() {
			if all.Client(id) != nil {
				admin = id
				break
			}
		}
		if code, body := nodetest.Call(t, all.Client(admin), "PUT", "/v1/skus/"+o.sku, fmt.Sprintf(`{"total":%d,"per_user":%d}`, o.units, o.perUser)); code != 201 {
			t.Fatalf("create sale: %d %v", code, body)
		}
	}
	nodetest.WaitSaleEverywhere(t, all, o.sku)
	ids := buyerNodes.NodeIDs()
	tc := &tailClients{sc: buyerNodes, pool: map[string]*fasthttp.HostClient{}}
	perNode := o.conns/len(ids) + 16

	var (
		mu       sync.Mutex
		answers  []tailAnswer
		unsure   int
		wins     int
		midOnce  sync.Once
		midDone  = make(chan struct{})
		wg       sync.WaitGroup
		requests = make(chan [2]int) // buyer, attempt
	)
	record := func(a tailAnswer, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			unsure++
			return
		}
		answers = append(answers, a)
		if a.won() {
			wins++
			if o.midSale != nil && wins >= o.units*9/10 {
				midOnce.Do(func() {
					go func() { o.midSale(); close(midDone) }()
				})
			}
		}
	}
	for range o.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ba := range requests {
				b, a := ba[0], ba[1]
				user, reqID := fmt.Sprintf("u%d", b), fmt.Sprintf("%s-r%d-%d", o.sku, b, a)
				home := b + a
				if !resent(reqID, o.resendPercent) {
					record(tailDeduct(tc, ids, home, perNode, o.sku, b, user, reqID))
					continue
				}
				// The same request id at once: every other one to the same
				// node, the rest to the next node.
				twinNode := home + (b % 2)
				var twin sync.WaitGroup
				twin.Add(1)
				go func() {
					defer twin.Done()
					record(tailDeduct(tc, ids, twinNode, perNode, o.sku, b, user, reqID))
				}()
				record(tailDeduct(tc, ids, home, perNode, o.sku, b, user, reqID))
				twin.Wait()
			}
		}()
	}
	for b := range o.buyers {
		for a := range o.attempts {
			requests <- [2]int{b, a}
		}
	}
	close(requests)
	wg.Wait()
	if o.midSale != nil {
		select {
		case <-midDone:
		case <-time.After(60 * time.Second):
			t.Fatal("the mid-sale fault did not finish")
		}
	}
	lastBuyer := time.Now()
	if unsure > 0 {
		t.Errorf("%d request ids got no final answer", unsure)
	}
	checkTailAnswers(t, o, answers)

	// Nothing stranded: demand was above stock, so every unit is sold.
	nodetest.WaitFor(t, 20*time.Second, "every unit sold", func() bool {
		for _, id := range sc.NodeIDs() {
			if c := sc.Client(id); c != nil {
				_, a := nodetest.CallQuiet(c, "GET", "/v1/skus/"+o.sku+"/audit", "")
				if a == nil || a["sold"].(float64) != float64(o.units) {
					return false
				}
			}
		}
		return true
	})
	t.Logf("sold out on every node %s after the last buyer", time.Since(lastBuyer).Round(time.Millisecond))
	acked := map[string]bool{}
	for _, a := range answers {
		if a.won() {
			acked[a.order] = true
		}
	}
	checkClusterLedgers(t, sc, o.sku, acked)
	return answers
}

// checkTailAnswers fails on a flip, a late win, an order given twice, a
// buyer over the per-user limit, or more orders than units, and logs the
// sale's tail.
func checkTailAnswers(t *testing.T, o tailSale, answers []tailAnswer) {
	t.Helper()
	byReq := map[string][]tailAnswer{}
	orderBuyer := map[string]int{}
	buyerOrders := map[int]map[string]bool{}
	var firstSoldOutEnd time.Time
	outcomes := map[string]int{}
	for _, a := range answers {
		byReq[a.reqID] = append(byReq[a.reqID], a)
		outcomes[fmt.Sprintf("%d %s", a.code, a.errCode)]++
		if a.lost() && a.errCode == "sold_out" && (firstSoldOutEnd.IsZero() || a.end.Before(firstSoldOutEnd)) {
			firstSoldOutEnd = a.end
		}
		if a.won() {
			if other, ok := orderBuyer[a.order]; ok && other != a.buyer {
				t.Errorf("order %s given to buyers %d and %d", a.order, other, a.buyer)
			}
			orderBuyer[a.order] = a.buyer
			if buyerOrders[a.buyer] == nil {
				buyerOrders[a.buyer] = map[string]bool{}
			}
			buyerOrders[a.buyer][a.order] = true
		}
	}
	t.Logf("answers: %v", outcomes)
	flips := 0
	for req, as := range byReq {
		var win, loss *tailAnswer
		for i := range as {
			switch {
			case as[i].won():
				if win != nil && win.order != as[i].order {
					t.Errorf("request id %s won two orders: %s and %s", req, win.order, as[i].order)
				}
				win = &as[i]
			case as[i].lost():
				loss = &as[i]
			}
		}
		if win != nil && loss != nil {
			flips++
			if flips <= 5 {
				t.Errorf("flip: request id %s won %s (%s-%s) and lost %s (%s-%s)", req, win.order,
					win.start.Format("15:04:05.000"), win.end.Format("15:04:05.000"), loss.errCode,
					loss.start.Format("15:04:05.000"), loss.end.Format("15:04:05.000"))
			}
		}
	}
	if flips > 0 {
		t.Errorf("%d request ids answered both a win and a loss", flips)
	}
	if len(orderBuyer) > o.units {
		t.Fatalf("oversold: %d orders for %d units", len(orderBuyer), o.units)
	}
	if o.perUser > 0 {
		for b, orders := range buyerOrders {
			if len(orders) > o.perUser {
				t.Errorf("buyer %d holds %d orders, the limit is %d", b, len(orders), o.perUser)
			}
		}
	}
	var lastWinEnd time.Time
	late := 0
	var wins []time.Time
	for _, a := range answers {
		if !a.won() {
			continue
		}
		wins = append(wins, a.end)
		if a.end.After(lastWinEnd) {
			lastWinEnd = a.end
		}
		if !firstSoldOutEnd.IsZero() && a.start.After(firstSoldOutEnd) {
			late++
			if late <= 5 {
				t.Errorf("late win: %s (order %s) started %s after the first sold_out answer", a.reqID, a.order, a.start.Sub(firstSoldOutEnd))
			}
		}
	}
	if late > 0 {
		t.Errorf("%d deducts that started after a sold_out answer won", late)
	}
	sort.Slice(wins, func(i, j int) bool { return wins[i].Before(wins[j]) })
	if !firstSoldOutEnd.IsZero() {
		t.Logf("tail: first sold_out answer to last win %s", max(lastWinEnd.Sub(firstSoldOutEnd), 0).Round(time.Millisecond))
	}
}

// oneNode is a single running node seen as a salesCluster.
type oneNode struct{ n *node.Node }

func (o oneNode) NodeIDs() []string { return []string{"n1"} }
func (o oneNode) Client(string) *fasthttp.HostClient {
	return nodetest.ClientOf(o.n, 32)
}

func flashTail(sku string) tailSale {
	return tailSale{sku: sku, units: 3000, buyers: 30000, conns: 300, attempts: 1, resendPercent: 15}
}

func TestTail_OneNodeNoFlipsNoLateWins(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	runTailSale(t, oneNode{n}, flashTail("one"))
	// The node exports its tail: first sold_out answer, last win, length.
	c := nodetest.ClientOf(n, 1)
	for _, name := range []string{`stockd_sale_tail_seconds{sku="one"}`, `stockd_sale_first_sold_out_timestamp_seconds{sku="one"}`, `stockd_sale_last_win_timestamp_seconds{sku="one"}`} {
		v, err := strconv.ParseFloat(metricValue(t, c, name), 64)
		if err != nil || v < 0 {
			t.Fatalf("%s: %q %v", name, metricValue(t, c, name), err)
		}
	}
}

func TestTail_ThreeNodesNoFlipsNoLateWins(t *testing.T) {
	c := nodetest.StartCluster(t)
	runTailSale(t, c, flashTail("three"))
}

func TestTail_PerUserLimitThreeAttemptsPerBuyer(t *testing.T) {
	c := nodetest.StartCluster(t)
	o := flashTail("limited")
	o.perUser, o.attempts, o.buyers = 1, 3, 10000
	runTailSale(t, c, o)
}

func TestTail_LeaderKilledInTheLastTenthOfTheSale(t *testing.T) {
	c := nodetest.StartCluster(t)
	o := flashTail("failover")
	o.midSale = func() {
		leader := c.Leader()
		if leader == "" {
			t.Error("no leader at 90 % of the sale")
			return
		}
		c.Crash(leader)
		t.Logf("crashed leader %s at 90 %% of the sale", leader)
		// Back on its data dir: it loads its leased units again and sells
		// or returns them.
		c.Start(leader, nil)
	}
	runTailSale(t, c, o)
}

// TestTail_IdleHolderGivesUnitsToBuyersElsewhere: with the idle return
// off, one node holds a large lease and sees no buyers; the buyers on the
// other nodes still win every unit (through the rebalance), and nobody is
// told sold_out while a unit is left.
func TestTail_IdleHolderGivesUnitsToBuyersElsewhere(t *testing.T) {
	const units = 2000
	c := nodetest.StartClusterWith(t, func(cfg *node.Config) { cfg.Engine.LeaseIdleReturn = time.Hour })
	holder := c.IDs[2]
	if code, body := nodetest.Call(t, c.Client(holder), "PUT", "/v1/skus/idle", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	// A few buyers on the holder make it lease a large chunk.
	for b := range 5 {
		if code, body := nodetest.Call(t, c.Client(holder), "POST", "/v1/skus/idle/deduct", fmt.Sprintf(`{"user":"early%d","request_id":"early%d"}`, b, b)); code != 200 {
			t.Fatalf("early deduct: %d %v", code, body)
		}
	}
	_, a := nodetest.Call(t, c.Client(holder), "GET", "/v1/skus/idle/audit", "")
	held := a["leased"].(map[string]any)[holder].(float64)
	if held < units/10 {
		t.Fatalf("the holder leased only %v units", held)
	}
	t.Logf("%s holds %v of %d units and gets no more buyers", holder, held, units)
	// Everyone else buys on the other two nodes.
	others := &subset{c: c, ids: c.IDs[:2]}
	start := time.Now()
	o := tailSale{sku: "idle", units: units, buyers: 10000, conns: 200, attempts: 1, resendPercent: 15}
	answers := runTailSaleOn(t, others, c, o)
	var lastWin time.Time
	for _, a := range answers {
		if a.won() && a.end.After(lastWin) {
			lastWin = a.end
		}
	}
	_, a = nodetest.Call(t, c.Client(holder), "GET", "/v1/skus/idle/audit", "")
	t.Logf("buyers elsewhere won the idle node's units; last win %s after the first buyer; given back on demand: %v",
		lastWin.Sub(start).Round(time.Millisecond), metricValue(t, c.Client(holder), "stockd_lease_given_back_units_total"))
	if a["sold"].(float64) != units {
		t.Fatalf("sold %v of %d", a["sold"], units)
	}
}

// subset is some of a cluster's nodes, as a salesCluster.
type subset struct {
	c   *nodetest.Cluster
	ids []string
}

func (s *subset) NodeIDs() []string                     { return s.ids }
func (s *subset) Client(id string) *fasthttp.HostClient { return s.c.Client(id) }

// runTailSaleOn runs a sale whose SKU exists already, with buyers on
// buyers' nodes only, and checks it on every node of all.
func runTailSaleOn(t *testing.T, buyers nodetest.SalesCluster, all nodetest.SalesCluster, o tailSale) []tailAnswer {
	t.Helper()
	return runTailSaleWith(t, buyers, all, o, false)
}

// metricValue reads one unlabelled series from a node's /metrics.
func metricValue(t *testing.T, c *fasthttp.HostClient, name string) string {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, "/metrics"))
	if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(resp.Body()), "\n") {
		if len(line) > len(name) && line[:len(name)] == name && line[len(name)] == ' ' {
			return line[len(name)+1:]
		}
	}
	return "absent"
}
