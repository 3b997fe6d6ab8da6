package scenario

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/client"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm"
)

// ledgerOrders reads every order of sku from a node (the NDJSON stream),
// by request id.
func ledgerOrders(t *testing.T, node *fasthttp.HostClient, sku string) map[string][]string {
	t.Helper()
	body := nodetest.GetRaw(t, node, "/v1/skus/"+sku+"/orders")
	out := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader([]byte(body)))
	for sc.Scan() {
		var o struct {
			OrderID   string `json:"order_id"`
			RequestID string `json:"request_id"`
			Done      bool   `json:"done"`
		}
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatalf("orders stream line %q: %v", sc.Text(), err)
		}
		if !o.Done {
			out[o.RequestID] = append(out[o.RequestID], o.OrderID)
		}
	}
	return out
}

// clientBuy is one buyer's call through a client: its order (the request
// id always set) and error.
type clientBuy struct {
	order client.Order
	err   error
}

// buyThrough runs buyers deducts (buyer b: user u<b>, request id cl-<b>,
// SKU skuOf(b)) on workers goroutines through deduct; dispatch runs
// before buyer b is handed out.
func buyThrough(deduct func(context.Context, client.Deduct) (client.Order, error), skuOf func(int) string, buyers, workers int, dispatch func(b int)) []clientBuy {
	results := make([]clientBuy, buyers)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				o, err := deduct(ctx, client.Deduct{SKU: skuOf(b), User: fmt.Sprintf("u%d", b), RequestID: fmt.Sprintf("cl-%d", b)})
				cancel()
				results[b] = clientBuy{o, err}
			}
		}()
	}
	for b := range buyers {
		dispatch(b)
		next <- b
	}
	close(next)
	wg.Wait()
	return results
}

// checkClientWins checks a sale's buys against its ledger's orders (by
// request id) and audit: every call ended in a win, sold_out or an error
// naming its request id; no request id has two orders; each reported win
// is its order; an order whose buyer was told it lost does not exist (a
// call without a definite answer may have one). It returns the reported
// wins by request id and the number of calls without a definite answer.
func checkClientWins(t *testing.T, results []clientBuy, orders map[string][]string, audit map[string]any) (map[string]string, int) {
	t.Helper()
	reported := map[string]string{}
	notDefinite := map[string]bool{}
	for b, r := range results {
		var nd *client.NotDefiniteError
		want := fmt.Sprintf("cl-%d", b)
		switch {
		case r.err == nil:
			if r.order.OrderID == "" || r.order.RequestID != want {
				t.Fatalf("buyer %d won %+v", b, r.order)
			}
			reported[want] = r.order.OrderID
		case errors.Is(r.err, client.ErrSoldOut):
		case errors.As(r.err, &nd) && nd.RequestID == want:
			notDefinite[want] = true
		default:
			t.Fatalf("buyer %d: %v", b, r.err)
		}
	}
	for req, ids := range orders {
		if len(ids) != 1 {
			t.Fatalf("request id %s has %d orders: %v", req, len(ids), ids)
		}
		if reported[req] == "" && !notDefinite[req] {
			t.Fatalf("order %s (request id %s) is in the ledger; its buyer was told it lost", ids[0], req)
		}
	}
	for req, id := range reported {
		if got := orders[req]; len(got) != 1 || got[0] != id {
			t.Fatalf("the client reported %s's win as order %s; the ledger holds %v", req, id, got)
		}
	}
	if sold := int(audit["sold"].(float64)); sold != len(orders) || sold < len(reported) || sold > len(reported)+len(notDefinite) {
		t.Fatalf("sold %d, orders %d, reported wins %d, not definite %d", sold, len(orders), len(reported), len(notDefinite))
	}
	return reported, len(notDefinite)
}

// clientOfCluster is a client.Client that knows endpoint and has found
// the cluster's members, closed at the test's end.
func clientOfCluster(t *testing.T, endpoint string, members int) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{Endpoints: []string{endpoint}, RefreshInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	nodetest.WaitFor(t, 10*time.Second, "the client to find the cluster's members", func() bool { return len(cl.Members()) == members })
	return cl
}

// startClientNode is a node and a client.Client of it, closed at the
// test's end.
func startClientNode(t *testing.T) (*node.Node, *client.Client) {
	t.Helper()
	n := nodetest.StartNode(t, t.TempDir())
	cl, err := client.New(client.Config{Endpoints: []string{"http://" + n.HTTPAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return n, cl
}

// TestClient_LeaderCrashedMidSale: 200 goroutines buy through one
// client.Client that knows one endpoint; the leader crashes in the middle
// of the sale and comes back on another HTTP port. Every call ends in a
// win, a definite refusal, or an error naming its request id; the wins
// the client reported are the ledger's orders, no request id has two, and
// the ledgers obey the law.
func TestClient_LeaderCrashedMidSale(t *testing.T) {
	c := nodetest.StartCluster(t)
	const units, buyers, workers = 300, 600, 200
	if code, body := nodetest.Call(t, c.Client(c.Leader()), "PUT", "/v1/skus/phone", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "phone")
	cl := clientOfCluster(t, "http://"+c.Node("n1").HTTPAddr(), 3)

	leader := ""
	results := buyThrough(cl.Deduct, func(int) string { return "phone" }, buyers, workers, func(b int) {
		switch b {
		case buyers / 3:
			leader = c.Leader()
			c.Crash(leader)
		case 2 * buyers / 3:
			c.Start(leader, nil)
		}
	})
	nodetest.WaitReady(t, c)
	audit := checkClusterLedgers(t, c, "phone", nil)
	reported, notDefinite := checkClientWins(t, results, ledgerOrders(t, c.Client(c.Leader()), "phone"), audit)
	orders := len(reported)
	t.Logf("crashed %s at buyer %d, restarted at %d: %d wins reported, %d not definite", leader, buyers/3, 2*buyers/3, orders, notDefinite)
}

// TestClient_CallsBesideDeduct: sales, holds confirmed and cancelled,
// order reads and lottery entries through the client against one node.
func TestClient_CallsBesideDeduct(t *testing.T) {
	n, cl := startClientNode(t)
	ctx := context.Background()
	sale, err := cl.CreateSale(ctx, "tv", client.SaleConfig{Total: 3, HoldTTL: time.Minute})
	if err != nil || sale.Total != 3 || sale.State != "open" || sale.HoldTTL != "1m0s" {
		t.Fatalf("create: %+v %v", sale, err)
	}
	if _, err := cl.CreateSale(ctx, "tv", client.SaleConfig{Total: 4}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("create with another config: %v", err)
	}
	a, err := cl.Deduct(ctx, client.Deduct{SKU: "tv", User: "alice"})
	if err != nil || a.State != "held" || a.ExpiresAt.IsZero() {
		t.Fatalf("alice: %+v %v", a, err)
	}
	b, err := cl.Deduct(ctx, client.Deduct{SKU: "tv", User: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := cl.Confirm(ctx, a.OrderID); err != nil || o.State != "sold" {
		t.Fatalf("confirm: %+v %v", o, err)
	}
	if o, err := cl.Confirm(ctx, a.OrderID); err != nil || o.State != "sold" {
		t.Fatalf("confirm again: %+v %v", o, err)
	}
	if o, err := cl.Cancel(ctx, b.OrderID); err != nil || o.State != "released" {
		t.Fatalf("cancel: %+v %v", o, err)
	}
	if _, err := cl.Cancel(ctx, a.OrderID); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("cancel of a sold order: %v", err)
	}
	if o, err := cl.Order(ctx, a.OrderID); err != nil || o.User != "alice" || o.RequestID != a.RequestID {
		t.Fatalf("order: %+v %v", o, err)
	}
	if _, err := cl.Order(ctx, "n1-0-none"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("an order that does not exist: %v", err)
	}
	if s, err := cl.SKU(ctx, "tv"); err != nil || s.Sold != 1 || s.Remaining != 2 {
		t.Fatalf("sku: %+v %v", s, err)
	}
	if _, err := cl.Deduct(ctx, client.Deduct{SKU: "tv", User: "alice", Qty: 2, RequestID: a.RequestID}); !errors.Is(err, client.ErrRequestIDReused) {
		t.Fatalf("alice's id for 2 units: %v", err)
	}
	if _, err := cl.CreateSale(ctx, "draw", client.SaleConfig{Total: 1, Lottery: true, EntriesCloseAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	e, err := cl.Enter(ctx, "draw", "carol", "c-1")
	if err != nil || e.State != "entered" || e.User != "carol" {
		t.Fatalf("enter: %+v %v", e, err)
	}
	if again, err := cl.Enter(ctx, "draw", "carol", "c-2"); err != nil || again.EntryID != e.EntryID {
		t.Fatalf("a second entry: %+v %v", again, err)
	}
	if st, err := cl.Entry(ctx, "draw", "carol"); err != nil || st.EntryID != e.EntryID {
		t.Fatalf("entry: %+v %v", st, err)
	}
	if _, err := cl.Enter(ctx, "tv", "dave", ""); !errors.Is(err, client.ErrNotALottery) {
		t.Fatalf("entry into a sale: %v", err)
	}
	if s, err := cl.Restock(ctx, "tv", 2); err != nil || s.Total != 5 {
		t.Fatalf("restock: %+v %v", s, err)
	}
	if st, err := cl.Cluster(ctx); err != nil || st.NodeID != "n1" || st.LedgerRules != raftfsm.RulesCurrent || len(st.Nodes) != 1 {
		t.Fatalf("cluster: %+v %v", st, err)
	}
	if s, err := cl.CloseSale(ctx, "tv"); err != nil || s.State != "closed" {
		t.Fatalf("close: %+v %v", s, err)
	}
	if _, err := cl.Deduct(ctx, client.Deduct{SKU: "tv", User: "erin"}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("deduct after close: %v", err)
	}
	nodetest.CheckLedger(t, nodetest.ClientOf(n, 1), "tv")
}

// TestClient_DeductBatch: a batch over two requests of the route's limit,
// with a sold-out tail and an item reusing an earlier item's id: each
// item's answer in order, every win an order of the ledger.
func TestClient_DeductBatch(t *testing.T) {
	n, cl := startClientNode(t)
	ctx := context.Background()
	if _, err := cl.CreateSale(ctx, "a", client.SaleConfig{Total: 1200}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateSale(ctx, "b", client.SaleConfig{Total: 1}); err != nil {
		t.Fatal(err)
	}
	ds := make([]client.Deduct, 0, 1500)
	for i := range 1500 {
		ds = append(ds, client.Deduct{SKU: "a", User: fmt.Sprintf("u%d", i)})
	}
	ds[1200] = client.Deduct{SKU: "b", User: "u0", RequestID: "shared"}
	ds[1201] = client.Deduct{SKU: "a", User: "u0", RequestID: "shared"} // the same user's id, another SKU
	res := cl.DeductBatch(ctx, ds)
	wins := 0
	for i, r := range res {
		switch {
		case r.Order.RequestID == "":
			t.Fatalf("item %d has no request id", i)
		case i == 1201:
			if !errors.Is(r.Err, client.ErrRequestIDReused) {
				t.Fatalf("item 1201: %v", r.Err)
			}
		case r.Err == nil:
			wins++
		case !errors.Is(r.Err, client.ErrSoldOut):
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	a, b := nodetest.CheckLedger(t, nodetest.ClientOf(n, 1), "a"), nodetest.CheckLedger(t, nodetest.ClientOf(n, 1), "b")
	if sold := int(a["sold"].(float64) + b["sold"].(float64)); wins != 1201 || sold != wins {
		t.Fatalf("%d wins reported, %d sold; want 1201 (1200 of a, 1 of b)", wins, sold)
	}
}

// TestClient_ShardedOverTwoClusters: sales and a batch over two clusters
// through client.NewSharded: each SKU exists and sells only on its own
// cluster, and the wins are the two ledgers' sold units.
func TestClient_ShardedOverTwoClusters(t *testing.T) {
	east, west := nodetest.StartNode(t, t.TempDir()), nodetest.StartNode(t, t.TempDir())
	nodes := map[string]*node.Node{"east": east, "west": west}
	s, err := client.NewSharded([]client.Config{
		{Name: "east", Endpoints: []string{"http://" + east.HTTPAddr()}},
		{Name: "west", Endpoints: []string{"http://" + west.HTTPAddr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var ds []client.Deduct
	on := map[string]int{}
	for k := range 10 {
		sku := fmt.Sprintf("sku%d", k)
		on[s.ClusterOf(sku)]++
		if _, err := s.CreateSale(ctx, sku, client.SaleConfig{Total: 20}); err != nil {
			t.Fatal(err)
		}
		for u := range 30 {
			ds = append(ds, client.Deduct{SKU: sku, User: fmt.Sprintf("u%d", u)})
		}
	}
	if on["east"] == 0 || on["west"] == 0 {
		t.Fatalf("ten SKUs all on one cluster: %v", on)
	}
	wins := 0
	for i, r := range s.DeductBatch(ctx, ds) {
		switch {
		case r.Err == nil:
			wins++
		case !errors.Is(r.Err, client.ErrSoldOut):
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	sold := 0
	for k := range 10 {
		sku := fmt.Sprintf("sku%d", k)
		for name, n := range nodes {
			code, _ := nodetest.Call(t, nodetest.ClientOf(n, 1), "GET", "/v1/skus/"+sku, "")
			if own := name == s.ClusterOf(sku); own != (code == 200) {
				t.Fatalf("%s on %s: %d (its cluster is %s)", sku, name, code, s.ClusterOf(sku))
			}
			if code == 200 {
				sold += int(nodetest.CheckLedger(t, nodetest.ClientOf(n, 1), sku)["sold"].(float64))
			}
		}
	}
	if wins != 200 || sold != wins {
		t.Fatalf("%d wins, %d sold; want 200 (ten sales of 20)", wins, sold)
	}
	o, err := s.Deduct(ctx, client.Deduct{SKU: "sku0", User: "late"})
	if !errors.Is(err, client.ErrSoldOut) || o.RequestID == "" {
		t.Fatalf("a deduct after the sell-out: %+v %v", o, err)
	}
}

// TestClient_TokensOnANode: a node with a service and an admin token
// refuses a client without them (401, ErrUnauthorized) and serves one
// with them.
func TestClient_TokensOnANode(t *testing.T) {
	cfg := nodetest.NodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
	cfg.HTTP.ServiceToken, cfg.HTTP.AdminToken = "svc-token", "adm-token"
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	nodetest.WaitFor(t, 10*time.Second, "node ready", func() bool {
		code, _ := nodetest.CallQuiet(nodetest.ClientOf(n, 1), "GET", "/readyz", "")
		return code == 200 && n.Ledger().Rules() == raftfsm.RulesCurrent
	})
	ctx := context.Background()
	bare, err := client.New(client.Config{Endpoints: []string{"http://" + n.HTTPAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := bare.Deduct(ctx, client.Deduct{SKU: "a", User: "u"}); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("a deduct without the service token: %v", err)
	}
	cl, err := client.New(client.Config{Endpoints: []string{"http://" + n.HTTPAddr()}, ServiceToken: "svc-token", AdminToken: "adm-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateSale(ctx, "a", client.SaleConfig{Total: 1}); err != nil {
		t.Fatal(err)
	}
	if o, err := cl.Deduct(ctx, client.Deduct{SKU: "a", User: "u"}); err != nil || o.State != "sold" {
		t.Fatalf("a deduct with the token: %+v %v", o, err)
	}
}

// TestClient_QueuedSale: a queued sale through the client: Join (twice:
// one ticket), Ticket's long-poll until admitted, Deduct with the token,
// and the refusals as sentinels (no token, the spent token, a join of a
// sale without a waiting room).
func TestClient_QueuedSale(t *testing.T) {
	_, cl := startClientNode(t)
	ctx := context.Background()
	start := time.Now().Add(time.Second)
	sale, err := cl.CreateSale(ctx, "qc", client.SaleConfig{Total: 2, StartAt: start, Queue: true, QueueOveradmit: 1.5, QueueAdmitTTL: time.Minute})
	if err != nil || sale.Total != 2 {
		t.Fatalf("create: %+v %v", sale, err)
	}
	first, err := cl.Join(ctx, "qc", "alice")
	again, err2 := cl.Join(ctx, "qc", "alice")
	if err != nil || err2 != nil || first.Ticket == "" || again.Ticket != first.Ticket || first.State != client.TicketWaiting {
		t.Fatalf("joins: %+v %v / %+v %v", first, err, again, err2)
	}
	tk := first
	deadline := time.Now().Add(20 * time.Second)
	for tk.State != client.TicketAdmitted && time.Now().Before(deadline) {
		if tk, err = cl.Ticket(ctx, first.Ticket, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if tk.State != client.TicketAdmitted || tk.AdmissionToken == "" || tk.Position != 1 {
		t.Fatalf("alice's ticket after the open: %+v", tk)
	}
	if _, err := cl.Deduct(ctx, client.Deduct{SKU: "qc", User: "alice"}); !errors.Is(err, client.ErrAdmissionRequired) {
		t.Fatalf("a deduct without the token: %v", err)
	}
	o, err := cl.Deduct(ctx, client.Deduct{SKU: "qc", User: "alice", AdmissionToken: tk.AdmissionToken})
	if err != nil || o.State != "sold" {
		t.Fatalf("alice's deduct with her token: %+v %v", o, err)
	}
	if _, err := cl.Deduct(ctx, client.Deduct{SKU: "qc", User: "alice", AdmissionToken: tk.AdmissionToken}); !errors.Is(err, client.ErrAdmissionInvalid) {
		t.Fatalf("the spent token again: %v", err)
	}
	if _, err := cl.CreateSale(ctx, "plain", client.SaleConfig{Total: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Join(ctx, "plain", "bob"); !errors.Is(err, client.ErrNotQueued) {
		t.Fatalf("a join of a sale without a waiting room: %v", err)
	}
	if bought, err := cl.Ticket(ctx, first.Ticket, 0); err != nil || bought.State != client.TicketBought {
		t.Fatalf("alice's ticket after her purchase: %+v %v", bought, err)
	}
}
