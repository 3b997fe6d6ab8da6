package scenario

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node/nodetest"
)

// The tests here try stockd as a shop's engineer would: a write through
// one node, the next call on another node within a millisecond (keep-alive
// clients, so no connection set-up lies between them), many times over, on
// three real processes. Every answer given must be one the cluster still
// stands behind.

// truthRounds is how many times each window is tried.
const truthRounds = 50

// procCaller calls nodes of a process cluster, failing the test on a
// transport error.
type procCaller struct {
	t *testing.T
	p *procCluster
}

func (c procCaller) call(id, method, path, body string) (int, map[string]any) {
	c.t.Helper()
	return nodetest.Call(c.t, c.p.Client(id), method, path, body)
}

// deduct is one deduct on node id; it returns the status, the error code
// and the order id.
func (c procCaller) deduct(id, sku, user, requestID string) (int, string, map[string]any) {
	c.t.Helper()
	code, out := c.call(id, "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":%q,"request_id":%q}`, user, requestID))
	errCode, _ := out["error"].(string)
	return code, errCode, out
}

// mustDeduct is deduct that fails the test unless it is answered 200.
func (c procCaller) mustDeduct(id, sku, user, requestID, what string) map[string]any {
	c.t.Helper()
	code, _, out := c.deduct(id, sku, user, requestID)
	if code != 200 {
		c.t.Fatalf("%s: %s answered %d %v", what, id, code, out)
	}
	return out
}

func (c procCaller) mustWrite(id, method, path, body string) map[string]any {
	c.t.Helper()
	code, out := c.call(id, method, path, body)
	if code != 200 && code != 201 {
		c.t.Fatalf("%s %s on %s: %d %v", method, path, id, code, out)
	}
	return out
}

// TestMultiProcess_AnswersStayTrueAfterAWriteElsewhere: each window of
// issue "answers that stay true", truthRounds times on one cluster; in
// each, the node about to answer was just shown the state before the
// write (so its own view is as fresh as it gets, and the write lands
// inside it), then the write goes through another node, then the call
// comes to it at once.
func TestMultiProcess_AnswersStayTrueAfterAWriteElsewhere(t *testing.T) {
	needMultiProc(t)
	p := startProcCluster(t)
	c := procCaller{t, p}
	ids := p.NodeIDs()
	node := func(i int) string { return ids[i%len(ids)] }
	lin := "?consistency=linearizable"
	for _, sale := range []string{
		`PUT /v1/skus/restocked {"total":0}`,
		`PUT /v1/skus/cancelled {"total":1,"hold_ttl":"10m"}`,
		`PUT /v1/skus/peruser {"total":100000,"per_user":1,"hold_ttl":"10m"}`,
		`PUT /v1/skus/confirmed {"total":100000,"hold_ttl":"10m"}`,
		`PUT /v1/skus/self {"total":100000}`,
	} {
		f := strings.SplitN(sale, " ", 3)
		c.mustWrite(ids[0], f[0], f[1], f[2])
	}
	nodetest.WaitSaleEverywhere(t, p, "self")
	acked := map[string]map[string]bool{}
	ack := func(sku string, out map[string]any) {
		if acked[sku] == nil {
			acked[sku] = map[string]bool{}
		}
		acked[sku][out["order_id"].(string)] = true
	}

	t.Run("restock then deduct on another node", func(t *testing.T) {
		c := procCaller{t, p}
		for i := range truthRounds {
			writer, buyer, reader := node(i), node(i+1), node(i+2)
			if code, e, out := c.deduct(buyer, "restocked", fmt.Sprintf("probe-%d", i), "p"); code != 409 || e != "sold_out" {
				t.Fatalf("round %d: before the restock %s answered %d %v, want sold_out", i, buyer, code, out)
			}
			c.mustWrite(writer, "POST", "/v1/skus/restocked/restock", `{"qty":1}`)
			code, e, out := c.deduct(buyer, "restocked", fmt.Sprintf("buyer-%d", i), "r")
			if code != 200 {
				t.Fatalf("round %d: restock answered by %s, then %s answered the deduct %d %s %v: the unit is on sale", i, writer, buyer, code, e, out)
			}
			ack("restocked", out)
			if code, sku := c.call(reader, "GET", "/v1/skus/restocked"+lin, ""); code != 200 || sku["total"] != float64(i+1) || sku["sold"] != float64(i+1) {
				t.Fatalf("round %d: linearizable read on %s after the restock and the sale: %d %v, want total and sold %d", i, reader, code, sku, i+1)
			}
		}
	})

	t.Run("cancel then deduct on another node", func(t *testing.T) {
		c := procCaller{t, p}
		held := c.mustDeduct(ids[0], "cancelled", "holder-0", "r", "first hold")["order_id"].(string)
		for i := range truthRounds {
			writer, buyer, reader := node(i), node(i+1), node(i+2)
			if code, e, out := c.deduct(buyer, "cancelled", fmt.Sprintf("probe-%d", i), "p"); code != 409 || e != "sold_out" {
				t.Fatalf("round %d: while the unit is held %s answered %d %v, want sold_out", i, buyer, code, out)
			}
			c.mustWrite(writer, "POST", "/v1/orders/"+held+"/cancel", "")
			code, e, out := c.deduct(buyer, "cancelled", fmt.Sprintf("holder-%d", i+1), "r")
			if code != 200 {
				t.Fatalf("round %d: cancel answered by %s, then %s answered the deduct %d %s %v: the unit is on sale", i, writer, buyer, code, e, out)
			}
			if code, o := c.call(reader, "GET", "/v1/orders/"+held+lin, ""); code != 200 || o["state"] != "released" {
				t.Fatalf("round %d: linearizable read on %s of the cancelled order: %d %v", i, reader, code, o)
			}
			held = out["order_id"].(string)
		}
		ack("cancelled", map[string]any{"order_id": held})
	})

	t.Run("cancel then the same buyer on another node", func(t *testing.T) {
		c := procCaller{t, p}
		for i := range truthRounds {
			first, buyer, canceller := node(i), node(i+1), node(i+2)
			user := fmt.Sprintf("u-%d", i)
			out := c.mustDeduct(first, "peruser", user, "r-1", fmt.Sprintf("round %d: first hold", i))
			if code, e, out := c.deduct(buyer, "peruser", user, "r-2"); code != 409 || e != "user_limit" {
				t.Fatalf("round %d: second unit while the first is held: %s answered %d %v, want user_limit", i, buyer, code, out)
			}
			c.mustWrite(canceller, "POST", "/v1/orders/"+out["order_id"].(string)+"/cancel", "")
			code, e, again := c.deduct(buyer, "peruser", user, "r-3")
			if code != 200 {
				t.Fatalf("round %d: hold cancelled by %s, then %s answered the buyer %d %s %v: they hold nothing", i, canceller, buyer, code, e, again)
			}
			ack("peruser", again)
		}
	})

	t.Run("confirm then read and repeat on other nodes", func(t *testing.T) {
		c := procCaller{t, p}
		for i := range truthRounds {
			buyer, reader, confirmer := node(i), node(i+1), node(i+2)
			user := fmt.Sprintf("c-%d", i)
			out := c.mustDeduct(buyer, "confirmed", user, "r", fmt.Sprintf("round %d: hold", i))
			if out["state"] != "held" {
				t.Fatalf("round %d: hold: %v", i, out)
			}
			id := out["order_id"].(string)
			if code, o := c.call(reader, "GET", "/v1/orders/"+id, ""); code != 200 || o["state"] != "held" {
				t.Fatalf("round %d: %s reads the new hold %d %v", i, reader, code, o)
			}
			c.mustWrite(confirmer, "POST", "/v1/orders/"+id+"/confirm", "")
			if code, o := c.call(reader, "GET", "/v1/orders/"+id, ""); code != 200 || o["state"] != "sold" {
				t.Fatalf("round %d: confirmed by %s, then %s read the order %d %v: it is sold", i, confirmer, reader, code, o)
			}
			if code, _, o := c.deduct(buyer, "confirmed", user, "r"); code != 200 || o["state"] != "sold" {
				t.Fatalf("round %d: confirmed by %s, then %s answered a repeat %d %v: it is sold", i, confirmer, buyer, code, o)
			}
			if code, o := c.call(confirmer, "GET", "/v1/orders/"+id+lin, ""); code != 200 || o["state"] != "sold" {
				t.Fatalf("round %d: linearizable read on %s: %d %v", i, confirmer, code, o)
			}
			ack("confirmed", out)
		}
	})

	t.Run("deduct then read on the same node", func(t *testing.T) {
		c := procCaller{t, p}
		for i := range truthRounds {
			buyer, other := node(i), node(i+1)
			out := c.mustDeduct(buyer, "self", fmt.Sprintf("s-%d", i), "r", fmt.Sprintf("round %d: deduct", i))
			ack("self", out)
			if code, sku := c.call(buyer, "GET", "/v1/skus/self", ""); code != 200 || sku["sold"].(float64) < float64(i+1) {
				t.Fatalf("round %d: %s answered %d sales, then read the sale %d %v", i, buyer, i+1, code, sku)
			}
			if code, o := c.call(buyer, "GET", "/v1/orders/"+out["order_id"].(string), ""); code != 200 || o["state"] != "sold" {
				t.Fatalf("round %d: %s answered the order, then read it %d %v", i, buyer, code, o)
			}
			if code, o := c.call(other, "GET", "/v1/orders/"+out["order_id"].(string)+lin, ""); code != 200 || o["state"] != "sold" || o["applied_index"] == nil {
				t.Fatalf("round %d: linearizable read of the order on %s: %d %v", i, other, code, o)
			}
		}
	})

	t.Run("a queue's open shown on one node, then the ticket read on another", func(t *testing.T) {
		c := procCaller{t, p}
		const rounds = 20
		// One waiting room a round, opening 150 ms apart after a second
		// for the joins: the leader's tick opens each, and a buyer who
		// saw the open on one node reads her ticket on another at once.
		first := time.Now().Add(time.Second)
		secrets := make([]string, rounds)
		for i := range rounds {
			sku := fmt.Sprintf("room-%d", i)
			c.mustWrite(ids[0], "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":1000,"admission":"queue","queue_admit_ttl":"10s","start_at":%q}`,
				first.Add(time.Duration(i)*150*time.Millisecond).UTC().Format(time.RFC3339Nano)))
		}
		for i := range rounds {
			nodetest.WaitSaleEverywhere(t, p, fmt.Sprintf("room-%d", i))
			tk := c.mustWrite(node(i), "POST", fmt.Sprintf("/v1/skus/room-%d/queue", i), fmt.Sprintf(`{"user":"q-%d"}`, i))
			if tk["position"].(float64) != 0 {
				t.Fatalf("round %d: joined after the open (%v): the test needs a later start", i, tk)
			}
			secrets[i] = tk["ticket"].(string)
		}
		for i := range rounds {
			watcher, reader := node(i+1), node(i+2)
			var seen map[string]any
			nodetest.WaitFor(t, 10*time.Second, fmt.Sprintf("round %d: the open on %s", i, watcher), func() bool {
				code, tk := c.call(watcher, "GET", "/v1/queue/"+secrets[i]+"?wait=5s", "")
				seen = tk
				return code == 200 && tk["position"].(float64) > 0
			})
			if code, tk := c.call(reader, "GET", "/v1/queue/"+secrets[i], ""); code != 200 || tk["position"].(float64) < 1 {
				t.Fatalf("round %d: %s showed the ticket at position %v (%v), then %s answered %d %v", i, watcher, seen["position"], seen["state"], reader, code, tk)
			}
		}
		// Each buyer then buys her unit with her admission, through the
		// node she has not used yet, so the rooms' ledgers are checked
		// with the rest.
		for i := range rounds {
			var token string
			nodetest.WaitFor(t, 10*time.Second, fmt.Sprintf("round %d: the admission", i), func() bool {
				code, tk := c.call(node(i+1), "GET", "/v1/queue/"+secrets[i]+"?wait=5s", "")
				token, _ = tk["admission_token"].(string)
				return code == 200 && tk["state"] == "admitted" && token != ""
			})
			sku := fmt.Sprintf("room-%d", i)
			code, out := c.call(node(i), "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"q-%d","request_id":"buy","admission_token":%q}`, i, token))
			if code != 200 {
				t.Fatalf("round %d: the admitted buyer's deduct on %s: %d %v", i, node(i), code, out)
			}
			ack(sku, out)
		}
	})

	for sku, orders := range acked {
		if sku == "cancelled" || sku == "peruser" {
			// Their acknowledged holds were cancelled on purpose: only
			// the law and the agreement of the ledgers are checked.
			checkClusterLedgers(t, p, sku, nil)
			continue
		}
		checkClusterLedgers(t, p, sku, orders)
	}
}

// TestMultiProcess_FreshClusterAnswersUnderItsRules: 100 fresh clusters,
// each used the instant every node's /readyz answers 200: alice and bob
// send one request id through two nodes; neither is ever told of the
// other's order.
func TestMultiProcess_FreshClusterAnswersUnderItsRules(t *testing.T) {
	needMultiProc(t)
	bin := buildStockd(t, t.TempDir())
	rounds := 100
	if testing.Short() {
		rounds = 10
	}
	for i := range rounds {
		t.Run(fmt.Sprintf("cluster-%d", i), func(t *testing.T) {
			p := newProcCluster(t, bin, nil)
			for _, id := range p.ids {
				p.Start(id)
			}
			waitReadyTight(t, p)
			c := procCaller{t, p}
			ids := p.NodeIDs()
			c.mustWrite(ids[i%3], "PUT", "/v1/skus/s", `{"total":10}`)
			alice, bob := ids[(i+1)%3], ids[(i+2)%3]
			ca, _, a := c.deduct(alice, "s", "alice", "r-1")
			cb, eb, b := c.deduct(bob, "s", "bob", "r-1")
			if ca != 200 || a["user"] != nil && a["user"] != "alice" {
				t.Fatalf("alice on %s: %d %v", alice, ca, a)
			}
			switch {
			case cb == 200 && b["order_id"] == a["order_id"]:
				t.Fatalf("bob on %s was answered alice's order %v", bob, b)
			case cb != 200 && (cb != 422 || eb != "request_id_reused"):
				t.Fatalf("bob on %s: %d %v, want his own order (or 422 under old rules)", bob, cb, b)
			}
			if cb == 200 {
				if code, o := c.call(bob, "GET", fmt.Sprintf("/v1/orders/%s", b["order_id"]), ""); code != 200 || o["user"] != "bob" {
					t.Fatalf("bob's order reads %d %v", code, o)
				}
			}
			checkClusterLedgers(t, p, "s", nil)
		})
	}
}

// waitReadyTight polls every node's /readyz every millisecond until all
// answer 200 (within 30 s).
func waitReadyTight(t *testing.T, p *procCluster) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	ready := map[string]bool{}
	for len(ready) < len(p.ids) {
		if time.Now().After(deadline) {
			t.Fatalf("nodes ready within 30s: %v", ready)
		}
		for _, id := range p.ids {
			if ready[id] {
				continue
			}
			req.SetRequestURI(nodetest.URL(p.Client(id), "/readyz"))
			if err := p.Client(id).DoTimeout(req, resp, time.Second); err == nil && resp.StatusCode() == 200 {
				ready[id] = true
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMultiProcess_BatchJudgedInItemOrder: a batch of 1,000 buyers over a
// 300-unit sale, through the leader and through a follower, 20 times each:
// the winners are exactly the first 300 items.
func TestMultiProcess_BatchJudgedInItemOrder(t *testing.T) {
	needMultiProc(t)
	p := startProcCluster(t)
	c := procCaller{t, p}
	leader := p.Leader()
	follower := ""
	for _, id := range p.NodeIDs() {
		if id != leader {
			follower = id
			break
		}
	}
	const items, units = 1000, 300
	for i := range 40 {
		through := map[bool]string{true: leader, false: follower}[i%2 == 0]
		sku := fmt.Sprintf("b-%d", i)
		c.mustWrite(leader, "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":%d}`, units))
		nodetest.WaitSaleEverywhere(t, p, sku)
		var b strings.Builder
		b.WriteString(`{"deducts":[`)
		for j := range items {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"sku":%q,"user":"u-%d","request_id":%q}`, sku, j, sku)
		}
		b.WriteString(`]}`)
		code, out := c.call(through, "POST", "/v1/deducts", b.String())
		if code != 200 {
			t.Fatalf("batch %d through %s: %d %v", i, through, code, out)
		}
		results := out["results"].([]any)
		orders := map[string]bool{}
		for j, r := range results {
			st := r.(map[string]any)["status"].(float64)
			switch {
			case j < units && st != 200:
				t.Fatalf("batch %d through %s: item %d of the first %d answered %v", i, through, j, units, r)
			case j >= units && st == 200:
				t.Fatalf("batch %d through %s: item %d won while the first %d took the stock: %v", i, through, j, units, r)
			case j >= units && r.(map[string]any)["error"] != "sold_out":
				t.Fatalf("batch %d through %s: item %d answered %v, want sold_out", i, through, j, r)
			}
			if st == 200 {
				orders[r.(map[string]any)["order_id"].(string)] = true
			}
		}
		checkClusterLedgers(t, p, sku, orders)
	}
}
