package sink_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"stockd.dev/stockd/internal/dbtest"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/sink"
)

func TestSink_PostgreSQL(t *testing.T) { roundTrip(t, dbtest.Postgres(t)) }

func TestSink_MariaDB(t *testing.T) { roundTrip(t, dbtest.MariaDB(t)) }

// targets is every node's URL, for -target.
func targets(c *nodetest.Cluster) string {
	var urls []string
	for _, id := range c.NodeIDs() {
		urls = append(urls, "http://"+c.Node(id).HTTPAddr())
	}
	return strings.Join(urls, ",")
}

func runSink(t *testing.T, args ...string) string {
	t.Helper()
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sink.Main(ctx, args, &out, &errs); err != nil {
		t.Fatalf("stockd sink %v: %v\n%s", args, err, errs.String())
	}
	return errs.String()
}

func reconcile(args ...string) (string, error) {
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := sink.Reconcile(ctx, args, &out, &errs)
	return out.String() + errs.String(), err
}

// createSale creates sale sku through the leader and waits until every
// node reads it.
func createSale(t *testing.T, c *nodetest.Cluster, sku, body string) {
	t.Helper()
	if code, resp := nodetest.Call(t, c.Client(c.Leader()), "PUT", "/v1/skus/"+sku, body); code != 201 {
		t.Fatalf("create %s: %d %v", sku, code, resp)
	}
	nodetest.WaitSaleEverywhere(t, c, sku)
}

// roundTrip: three sales with holds over a three-node cluster; the sink
// runs before the sale (creating its tables), in the middle and at the
// end. Every order is inserted once (the audit trigger says so), every
// row holds the order's final state, reconcile agrees; then a deleted
// row, a changed state and a foreign row are each named.
func roundTrip(t *testing.T, srv *dbtest.Server) {
	c := nodetest.StartCluster(t)
	sinkArgs := []string{"-target", targets(c), "-db", srv.DSN, "-consumer", "shop", "-wait", "0s", "-exit-when-idle", "-progress", "0"}
	runSink(t, sinkArgs...)
	db := srv.DB()
	srv.AddAuditTrigger(t, db, "stockd_orders")

	skus := []string{"cup", "hat", "mug"}
	for _, sku := range skus {
		createSale(t, c, sku, `{"total":12,"hold_ttl":"8s"}`)
	}
	var orders []string
	for i := range 45 {
		sku, id := skus[i%3], c.NodeIDs()[i%3]
		code, body := nodetest.Call(t, c.Client(id), "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i))
		if code == 200 {
			orders = append(orders, body["order_id"].(string))
		} else if code != 409 {
			t.Fatalf("deduct %d: %d %v", i, code, body)
		}
	}
	if len(orders) != 36 {
		t.Fatalf("%d orders, want 36 (12 a sale)", len(orders))
	}
	for i, o := range orders {
		switch i % 3 {
		case 0:
			if code, body := nodetest.Call(t, c.Client(c.NodeIDs()[i%3]), "POST", "/v1/orders/"+o+"/confirm", ""); code != 200 {
				t.Fatalf("confirm %s: %d %v", o, code, body)
			}
		case 1:
			if code, body := nodetest.Call(t, c.Client(c.NodeIDs()[i%3]), "POST", "/v1/orders/"+o+"/cancel", ""); code != 200 {
				t.Fatalf("cancel %s: %d %v", o, code, body)
			}
		} // the rest expire
	}
	runSink(t, sinkArgs...) // some held, some settled
	for _, sku := range skus {
		nodetest.WaitFor(t, 40*time.Second, sku+"'s holds to expire", func() bool {
			_, s := nodetest.CallQuiet(c.Client(c.Leader()), "GET", "/v1/skus/"+sku, "")
			return s["held"] == float64(0)
		})
	}
	runSink(t, sinkArgs...)

	if n := srv.CheckInsertedOnce(t, db, "stockd_orders"); n != 36 {
		t.Fatalf("%d rows, want 36", n)
	}
	states := map[string]int{}
	for i, o := range orders {
		var state, reason string
		if err := db.QueryRow("SELECT state, release_reason FROM stockd_orders WHERE order_id = "+srv.Placeholder(1), o).Scan(&state, &reason); err != nil {
			t.Fatalf("order %s: %v", o, err)
		}
		want := [...]string{"sold", "released", "released"}[i%3]
		if state != want {
			t.Errorf("order %s: %s, want %s", o, state, want)
		}
		states[state+"/"+reason]++
	}
	if states["sold/"] != 12 || states["released/cancelled"]+states["released/expired"] != 24 {
		t.Fatalf("states and reasons in the table: %v", states)
	}
	args := []string{"-target", targets(c), "-db", srv.DSN, "-wait", "10s"}
	if out, err := reconcile(args...); err != nil || !strings.Contains(out, "36 orders in 3 sales agree") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	for _, sku := range skus {
		nodetest.CheckLedger(t, c.Client(c.Leader()), sku)
	}
	tamper(t, srv, db, orders, args)
}

// tamper deletes one row, changes one state and adds a foreign row:
// reconcile exits with ErrDiffer and names each.
func tamper(t *testing.T, srv *dbtest.Server, db *sql.DB, orders, args []string) {
	p := srv.Placeholder
	exec := func(q string, a ...any) {
		t.Helper()
		if _, err := db.Exec(q, a...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("DELETE FROM stockd_orders WHERE order_id = "+p(1), orders[4])
	exec("UPDATE stockd_orders SET state = 'sold' WHERE order_id = "+p(1), orders[7])
	exec("INSERT INTO stockd_orders (order_id, sku, buyer, qty, state, release_reason, request_id, created_at, updated_at, feed_cursor) "+
		"SELECT 'forged-1', sku, buyer, qty, state, release_reason, 'x', created_at, updated_at, feed_cursor FROM stockd_orders WHERE order_id = "+p(1), orders[0])
	exec("INSERT INTO stockd_orders (order_id, sku, buyer, qty, state, release_reason, request_id, created_at, updated_at, feed_cursor) "+
		"SELECT 'forged-2', 'nosuchsale', buyer, qty, state, release_reason, 'y', created_at, updated_at, feed_cursor FROM stockd_orders WHERE order_id = "+p(1), orders[0])
	out, err := reconcile(args...)
	if !errors.Is(err, sink.ErrDiffer) {
		t.Fatalf("reconcile after tampering: %v, want ErrDiffer\n%s", err, out)
	}
	for _, want := range []string{orders[4] + ": in stockd", orders[7] + ": stockd/table differ: state released/sold", "forged-1: in the table", "forged-2: in the table (nosuchsale"} {
		if !strings.Contains(out, "order "+want) {
			t.Errorf("reconcile does not say %q:\n%s", want, out)
		}
	}
	// The changed state also leaves its sale's sold total off by one.
	if !strings.Contains(err.Error(), "5 differences among 38 orders") || !strings.Contains(out, "held and 1 sold units, stockd's ledger 0 and 0") {
		t.Errorf("reconcile counts: %v\n%s", err, out)
	}
}

func TestSink_ResumesFromTheDatabase_PostgreSQL(t *testing.T) {
	resumesFromTheDatabase(t, dbtest.Postgres(t))
}

func TestSink_ResumesFromTheDatabase_MariaDB(t *testing.T) {
	resumesFromTheDatabase(t, dbtest.MariaDB(t))
}

// call is a call with a token.
func call(t *testing.T, c *nodetest.Cluster, token, method, path, body string) (int, map[string]any) {
	t.Helper()
	return nodetest.CallHeader(c.Client(c.NodeIDs()[0]), method, path, body, "Authorization", "Bearer "+token)
}

// resumesFromTheDatabase, on a cluster that requires tokens:
//   - after its first run (the admin token registers the consumer) the
//     sink acknowledges with the service token alone;
//   - a closed sale whose events the sink has not written cannot be
//     archived (409 unconsumed_events); once it has, it can;
//   - with the sink stopped while the sale goes on, stockd's cursor moved
//     to the head by hand: the sink started again reads after the
//     database's cursor, so the table holds every order and reconcile
//     agrees (trusting stockd's cursor would have missed them).
func resumesFromTheDatabase(t *testing.T, srv *dbtest.Server) {
	c := nodetest.StartClusterWith(t, func(cfg *node.Config) { cfg.HTTP.ServiceToken, cfg.HTTP.AdminToken = "svc", "adm" })
	common := []string{"-target", targets(c), "-db", srv.DSN, "-consumer", "shop", "-wait", "0s", "-exit-when-idle", "-progress", "0"}
	runSink(t, append(common, "-admin-token", "adm", "-service-token", "svc")...)
	serviceOnly := append(common, "-admin-token", "", "-service-token", "svc")
	for _, sku := range []string{"a", "b"} {
		if code, body := call(t, c, "adm", "PUT", "/v1/skus/"+sku, `{"total":20}`); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
		nodetest.WaitSaleEverywhere(t, c, sku)
	}
	deduct := func(sku string, from, to int) {
		for i := from; i < to; i++ {
			if code, body := call(t, c, "svc", "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"%s%d","request_id":"r%d"}`, sku, i, i)); code != 200 {
				t.Fatalf("deduct %s %d: %d %v", sku, i, code, body)
			}
		}
	}
	stockdCursor := func() string {
		_, st := call(t, c, "svc", "GET", "/v1/consumers", "")
		cs, _ := st["consumers"].([]any)
		if len(cs) != 1 {
			t.Fatalf("consumers: %v", st)
		}
		return cs[0].(map[string]any)["cursor"].(string)
	}
	dbCursor := func() string {
		var cur string
		if err := srv.DB().QueryRow("SELECT feed_cursor FROM stockd_orders_cursor WHERE consumer = 'shop'").Scan(&cur); err != nil {
			t.Fatal(err)
		}
		return cur
	}

	// Archiving waits for the sink.
	deduct("b", 0, 5)
	if code, body := call(t, c, "adm", "POST", "/v1/skus/b/close", ""); code != 200 {
		t.Fatalf("close b: %d %v", code, body)
	}
	if code, body := call(t, c, "adm", "POST", "/v1/skus/b/archive", ""); code != 409 || body["error"] != "unconsumed_events" {
		t.Fatalf("archive before the sink wrote b's orders: %d %v, want 409 unconsumed_events", code, body)
	}
	log := runSink(t, serviceOnly...)
	// The acknowledgement was committed; the node asked may apply it a
	// moment later.
	nodetest.WaitFor(t, 10*time.Second, "stockd's cursor at the database's after a run with the service token:\n"+log, func() bool {
		return stockdCursor() == dbCursor()
	})
	if code, body := call(t, c, "adm", "POST", "/v1/skus/b/archive", ""); code != 200 {
		t.Fatalf("archive once the sink caught up: %d %v", code, body)
	}

	// The sale goes on with the sink stopped; stockd's cursor is moved to
	// the head by hand.
	deduct("a", 0, 12)
	runSink(t, serviceOnly...)
	before := dbCursor()
	deduct("a", 12, 20)
	// The head after the node caught up with the leader (its own view may
	// trail the last deduct by a moment).
	_, st := call(t, c, "svc", "GET", "/v1/events?after=0&limit=1&consistency=linearizable", "")
	head := st["head"].(string)
	if code, body := call(t, c, "adm", "PUT", "/v1/consumers/shop", fmt.Sprintf(`{"cursor":%q}`, head)); code != 200 {
		t.Fatalf("move the consumer to the head: %d %v", code, body)
	}
	// The service token cannot move it back, nor create a consumer.
	if code, body := call(t, c, "svc", "PUT", "/v1/consumers/shop", fmt.Sprintf(`{"cursor":%q}`, before)); code != 200 || body["state"] != "already_past" || stockdCursor() != head {
		t.Fatalf("a service acknowledgement behind the consumer: %d %v, cursor %s", code, body, stockdCursor())
	}
	if code, body := call(t, c, "svc", "PUT", "/v1/consumers/other", `{"cursor":"0"}`); code != 404 {
		t.Fatalf("a service acknowledgement of an unknown consumer: %d %v, want 404", code, body)
	}
	if code, _ := call(t, c, "svc", "DELETE", "/v1/consumers/shop", ""); code != 401 {
		t.Fatalf("a service token dropped the consumer: %d", code)
	}
	log = runSink(t, serviceOnly...)
	if !strings.Contains(log, "reading after the database's") || !strings.Contains(log, "database="+before) {
		t.Fatalf("the sink did not say it resumes from the database's cursor %s:\n%s", before, log)
	}
	if dbCursor() != head {
		t.Fatalf("the database's cursor is %s, the head %s", dbCursor(), head)
	}
	var rows int
	if err := srv.DB().QueryRow("SELECT COUNT(*) FROM stockd_orders WHERE sku = 'a'").Scan(&rows); err != nil || rows != 20 {
		t.Fatalf("sale a has %d rows (%v), want 20", rows, err)
	}
	out, err := reconcile("-target", targets(c), "-db", srv.DSN, "-service-token", "svc", "-wait", "10s")
	if err != nil || !strings.Contains(out, "20 orders in 1 sales agree") || !strings.Contains(out, "sale b is archived") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	nodetest.CheckLedger(t, c.Client(c.Leader()), "a")
}

// TestSink_MetricsProgressAndABehindReconcile: while the sink is stopped
// and the sale goes on, reconcile gives up after -wait with ErrBehind
// (exit 2); a running sink serves its lag and cursor on -metrics and
// logs its progress; once it caught up, reconcile agrees.
func TestSink_MetricsProgressAndABehindReconcile(t *testing.T) {
	srv := dbtest.Postgres(t)
	c := nodetest.StartCluster(t)
	createSale(t, c, "pen", `{"total":50}`)
	common := []string{"-target", targets(c), "-db", srv.DSN, "-consumer", "shop"}
	runSink(t, append(common, "-wait", "0s", "-exit-when-idle", "-progress", "0")...)
	for i := range 30 {
		if code, body := nodetest.Call(t, c.Client(c.NodeIDs()[i%3]), "POST", "/v1/skus/pen/deduct", fmt.Sprintf(`{"user":"u%d"}`, i)); code != 200 {
			t.Fatalf("deduct %d: %d %v", i, code, body)
		}
	}
	out, err := reconcile("-target", targets(c), "-db", srv.DSN, "-wait", "300ms")
	if !errors.Is(err, sink.ErrBehind) || !strings.Contains(err.Error(), "the table is at feed cursor") {
		t.Fatalf("reconcile with the sink stopped: %v, want ErrBehind\n%s", err, out)
	}

	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- sink.Main(ctx, append(common, "-wait", "1s", "-progress", "100ms", "-metrics", "127.0.0.1:0"), &bytes.Buffer{}, logs)
	}()
	var addr string
	nodetest.WaitFor(t, 10*time.Second, "the sink's metrics address in its log", func() bool {
		_, rest, ok := strings.Cut(logs.String(), `msg=metrics`)
		if ok {
			_, addr, _ = strings.Cut(rest, "addr=")
			addr = strings.Fields(addr)[0]
		}
		return ok
	})
	nodetest.WaitFor(t, 10*time.Second, "the sink to report itself caught up on /metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := string(b)
		return strings.Contains(m, "stockd_sink_events_total 30\n") && strings.Contains(m, "stockd_sink_lag_events 0\n") &&
			strings.Contains(m, "stockd_sink_lag_seconds 0\n") && strings.Contains(m, "stockd_sink_transactions_total")
	})
	nodetest.WaitFor(t, 10*time.Second, "a progress line", func() bool {
		return strings.Contains(logs.String(), "msg=progress") && strings.Contains(logs.String(), "lag_events=0")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the sink stopped with %v", err)
	}
	if out, err := reconcile("-target", targets(c), "-db", srv.DSN, "-wait", "5s"); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSink_TwoSinksOnOneConsumerTakeTurns: two sinks on the same consumer
// and table while a sale runs (an operator started a second by mistake):
// each page is written by one of them, every order is inserted once, and
// reconcile agrees.
func TestSink_TwoSinksOnOneConsumerTakeTurns(t *testing.T) {
	srv := dbtest.Postgres(t)
	c := nodetest.StartCluster(t)
	createSale(t, c, "ink", `{"total":1000}`)
	args := []string{"-target", targets(c), "-db", srv.DSN, "-consumer", "shop", "-progress", "0"}
	runSink(t, append(args, "-wait", "0s", "-exit-when-idle")...)
	db := srv.DB()
	srv.AddAuditTrigger(t, db, "stockd_orders")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs [2]syncBuffer
	done := make(chan error, 2)
	for i := range logs {
		go func() {
			done <- sink.Main(ctx, append(args, "-wait", "200ms", "-limit", "7"), &bytes.Buffer{}, &logs[i])
		}()
	}
	for i := range 300 {
		if code, body := nodetest.Call(t, c.Client(c.NodeIDs()[i%3]), "POST", "/v1/skus/ink/deduct", fmt.Sprintf(`{"user":"u%d"}`, i)); code != 200 {
			t.Fatalf("deduct %d: %d %v", i, code, body)
		}
	}
	_, st := nodetest.Call(t, c.Client(c.Leader()), "GET", "/v1/events?after=0&limit=1&consistency=linearizable", "")
	head := st["head"].(string)
	nodetest.WaitFor(t, 30*time.Second, "the table to reach "+head, func() bool {
		var cur string
		return db.QueryRow("SELECT feed_cursor FROM stockd_orders_cursor WHERE consumer = 'shop'").Scan(&cur) == nil && cur == head
	})
	cancel()
	for range logs {
		if err := <-done; err != nil {
			t.Fatalf("a sink stopped with %v", err)
		}
	}
	if n := srv.CheckInsertedOnce(t, db, "stockd_orders"); n != 300 {
		t.Fatalf("%d rows, want 300", n)
	}
	turns := strings.Count(logs[0].String(), "resuming from the database's") + strings.Count(logs[1].String(), "resuming from the database's")
	t.Logf("the sinks found the cursor moved by the other %d times", turns)
	if out, err := reconcile("-target", targets(c), "-db", srv.DSN, "-wait", "5s"); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
}
