package eventloop_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// startLoopNode is one node serving plain deducts from its event loop
// (-http-event-loop, on by default), with a sale of units.
func startLoopNode(t *testing.T, units int, tune func(*node.Config)) *node.Node {
	t.Helper()
	return startLoopNodeIn(t, t.TempDir(), units, tune)
}

// startLoopNodeIn is startLoopNode with its data in dir.
func startLoopNodeIn(t *testing.T, dir string, units int, tune func(*node.Config)) *node.Node {
	t.Helper()
	n := nodetest.StartNodeWith(t, dir, func(c *node.Config) {
		c.DeductLoop = true
		if tune != nil {
			tune(c)
		}
	})
	c := nodetest.ClientOf(n, 1)
	if m := nodetest.GetRaw(t, c, "/metrics"); !strings.Contains(m, "\nstockd_http_event_loop_enabled 1\n") {
		t.Fatal("a node with -http-event-loop runs without its event loop")
	}
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/loop", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/none", `{"total":0}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	return n
}

// rawConn is one client connection that writes exact bytes and reads
// answers with net/http's parser.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatal(err)
	}
}

// answer reads one final response (past a 100 Continue): status, the
// JSON body and the headers.
func (r *rawConn) answer() (int, map[string]any, http.Header) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, nil)
	for err == nil && resp.StatusCode == http.StatusContinue {
		resp, err = http.ReadResponse(r.br, nil)
	}
	if err != nil {
		r.t.Fatalf("read an answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		r.t.Fatalf("answer %d %q is not JSON: %v", resp.StatusCode, b, err)
	}
	return resp.StatusCode, out, resp.Header
}

// closed reports whether the server closed the connection (EOF next).
func (r *rawConn) closed() bool {
	_, err := r.br.ReadByte()
	return err == io.EOF
}

func deductReq(sku, query, body string, headers ...string) string {
	h := ""
	for _, x := range headers {
		h += x + "\r\n"
	}
	return fmt.Sprintf("POST /v1/skus/%s/deduct%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", sku, query, h, len(body), body)
}

// loopCounts reads the loop's deducts served and connections handed over
// through mc, whose one connection the loop hands over at its first call.
func loopCounts(t *testing.T, mc *fasthttp.HostClient) (served, handed float64) {
	t.Helper()
	m := nodetest.GetRaw(t, mc, "/metrics")
	for _, line := range strings.Split(m, "\n") {
		var v float64
		if _, err := fmt.Sscanf(line, "stockd_http_event_loop_deducts_total %g", &v); err == nil {
			served = v
		}
		if _, err := fmt.Sscanf(line, "stockd_http_event_loop_handovers_total %g", &v); err == nil {
			handed = v
		}
	}
	return served, handed
}

// The loop answers plain deducts as the fasthttp route does, pipelined
// or split, and hands every other request, with its connection, to
// fasthttp, which answers it per the contract.
func TestEventLoop_ServesDeductsAndHandsTheRestOver(t *testing.T) {
	n := startLoopNode(t, 100, nil)
	addr := n.HTTPAddr()
	mc := nodetest.ClientOf(n, 1)
	served0, handed0 := loopCounts(t, mc)

	// A win, its repeat, wait=none, sold out, an unknown sale: all from
	// the loop, on one connection.
	r := dialRaw(t, addr)
	r.send(deductReq("loop", "", `{"user":"a","qty":1,"request_id":"r1"}`))
	code, first, h := r.answer()
	if code != 200 || first["state"] != "sold" || h.Get("Content-Type") != "application/json" || h.Get("Server") != "stockd" {
		t.Fatalf("win: %d %v %v", code, first, h)
	}
	r.send(deductReq("loop", "?wait=commit", `{"user":"a","qty":1,"request_id":"r1"}`))
	if code, again, _ := r.answer(); code != 200 || again["order_id"] != first["order_id"] {
		t.Fatalf("repeat: %d %v, first %v", code, again, first)
	}
	r.send(deductReq("loop", "?wait=none", `{"user":"b","qty":2,"request_id":"r2"}`))
	if code, got, _ := r.answer(); code != 202 || got["state"] != "pending" || got["qty"] != 2.0 {
		t.Fatalf("wait=none: %d %v", code, got)
	}
	r.send(deductReq("none", "", `{"user":"a","qty":1,"request_id":"r3"}`))
	if code, got, _ := r.answer(); code != 409 || got["error"] != "sold_out" {
		t.Fatalf("sold out: %d %v", code, got)
	}
	r.send(deductReq("nosuch", "", `{"user":"a","qty":1}`))
	if code, got, _ := r.answer(); code != 404 || got["error"] != "unknown_sku" {
		t.Fatalf("unknown sale: %d %v", code, got)
	}
	// Two pipelined in one write, then one written a few bytes at a time:
	// answered in order.
	r.send(deductReq("loop", "", `{"user":"c","request_id":"p1"}`) + deductReq("loop", "", `{"user":"d","request_id":"p2"}`))
	for _, user := range []string{"c", "d"} {
		code, got, _ := r.answer()
		if code != 200 {
			t.Fatalf("pipelined %s: %d %v", user, code, got)
		}
	}
	whole := deductReq("loop", "", `{"user":"e","request_id":"s1"}`)
	for i := 0; i < len(whole); i += 7 {
		r.send(whole[i:min(i+7, len(whole))])
	}
	if code, got, _ := r.answer(); code != 200 {
		t.Fatalf("split: %d %v", code, got)
	}
	if served, handed := loopCounts(t, mc); served-served0 != 8 || handed != handed0 {
		t.Fatalf("the loop answered %v deducts and handed over %v connections, want 8 and 0", served-served0, handed-handed0)
	}
	// A deduct and another request pipelined in one write: the loop
	// answers the first, fasthttp the second, in order, on one connection.
	r.send(deductReq("loop", "", `{"user":"m","request_id":"m1"}`) + "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, got, _ := r.answer(); code != 200 || got["state"] != "sold" {
		t.Fatalf("pipelined deduct: %d %v", code, got)
	}
	if code, got, _ := r.answer(); code != 200 || got["ok"] != true {
		t.Fatalf("pipelined healthz after it: %d %v", code, got)
	}
	handed0++

	// What the loop leaves to fasthttp, each on a connection that then
	// stays fasthttp's: the next deduct on it is answered too.
	cases := []struct {
		name, req string
		code      int
		errCode   string
	}{
		{"another route", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200, ""},
		{"a body that is not JSON", deductReq("loop", "", `{"user":`), 400, "bad_request"},
		{"qty out of range", deductReq("loop", "", `{"user":"f","qty":0}`), 400, "bad_request"},
		{"a bad wait", deductReq("loop", "?wait=later", `{"user":"f"}`), 400, "bad_request"},
		{"wait given twice", deductReq("loop", "?wait=none&wait=commit", `{"user":"k","request_id":"w1"}`), 400, "bad_request"},
		{"the header and body ids differ", deductReq("loop", "", `{"user":"f","request_id":"x"}`, "Idempotency-Key: y"), 400, "bad_request"},
		{"a bad sku", deductReq("bad%20sku", "", `{"user":"f"}`), 400, "bad_request"},
		{"chunked", "POST /v1/skus/loop/deduct HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"user\":\"chunk\"}\r\n0\r\n\r\n", 200, ""},
		{"Expect: 100-continue", deductReq("loop", "", `{"user":"g"}`, "Expect: 100-continue"), 200, ""},
		{"a GET of the route", "GET /v1/skus/loop/deduct HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed"},
		{"a head over 8 KiB", deductReq("loop", "", `{"user":"h"}`, "X-Pad: "+strings.Repeat("p", 9000)), 400, "bad_request"},
	}
	for i, tc := range cases {
		r := dialRaw(t, addr)
		r.send(tc.req)
		code, got, _ := r.answer()
		if code != tc.code || (tc.errCode != "" && got["error"] != tc.errCode) {
			t.Fatalf("%s: %d %v, want %d %s", tc.name, code, got, tc.code, tc.errCode)
		}
		if code == 400 && got["detail"] == "malformed http request" {
			continue // fasthttp closes a connection it cannot parse
		}
		r.send(deductReq("loop", "", fmt.Sprintf(`{"user":"after%d"}`, i)))
		if code, got, _ := r.answer(); code != 200 {
			t.Fatalf("%s: the next deduct on its connection: %d %v", tc.name, code, got)
		}
	}
	if _, handed := loopCounts(t, mc); handed-handed0 != float64(len(cases)) {
		t.Fatalf("handed over %v connections, want %d", handed-handed0, len(cases))
	}

	// Connection: close and HTTP/1.0 end the connection after the answer.
	for _, req := range []string{
		deductReq("loop", "", `{"user":"i"}`, "Connection: close"),
		"POST /v1/skus/loop/deduct HTTP/1.0\r\nContent-Length: 12\r\n\r\n{\"user\":\"j\"}",
	} {
		r := dialRaw(t, addr)
		r.send(req)
		if code, got, _ := r.answer(); code != 200 {
			t.Fatalf("%q: %d %v", req, code, got)
		}
		if !r.closed() {
			t.Fatalf("%q: the connection stayed open", req)
		}
	}
	// 20 wins: seven on the first connection (one of two units), eleven
	// after hand-overs, two before a close.
	a := nodetest.CheckLedger(t, mc, "loop")
	if a["orders"] != 20.0 || a["sold"] != 21.0 || a["orders_sold_units"] != a["sold"] {
		t.Fatalf("want 20 orders of 21 units: %v", a)
	}
}

// With -service-token the loop serves deducts that carry it and hands the
// rest to fasthttp, which answers 401.
func TestEventLoop_ServiceToken(t *testing.T) {
	n := startLoopNode(t, 10, func(c *node.Config) { c.HTTP.ServiceToken = "svc" })
	mc := nodetest.ClientOf(n, 1)
	served0, handed0 := loopCounts(t, mc)
	r := dialRaw(t, n.HTTPAddr())
	r.send(deductReq("loop", "", `{"user":"a"}`))
	if code, got, _ := r.answer(); code != 401 {
		t.Fatalf("no token: %d %v", code, got)
	}
	for _, token := range []string{"svc", "wrong"} {
		r := dialRaw(t, n.HTTPAddr())
		r.send(deductReq("loop", "", `{"user":"`+token+`"}`, "Authorization: Bearer "+token))
		if code, got, _ := r.answer(); (code == 200) != (token == "svc") {
			t.Fatalf("token %s: %d %v", token, code, got)
		}
	}
	if served, handed := loopCounts(t, mc); served-served0 != 1 || handed-handed0 != 2 {
		t.Fatalf("loop served %v, handed over %v; want 1 and 2", served-served0, handed-handed0)
	}
	if a := nodetest.CheckLedger(t, mc, "loop"); a["sold"] != 1.0 || a["orders"] != 1.0 {
		t.Fatalf("want the one deduct with the token sold: %v", a)
	}
}

// The loop accepts on the node's own listener, so an IPv6 -http address
// is served the same: a deduct through the loop, a repeat of it, a read
// handed over to fasthttp on the same connection.
func TestEventLoop_IPv6Loopback(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here (%v)", err)
	} else {
		ln.Close()
	}
	n := startLoopNode(t, 3, func(c *node.Config) { c.HTTP.Addr = "[::1]:0" })
	if !strings.HasPrefix(n.HTTPAddr(), "[::1]:") {
		t.Fatalf("the node listens on %s, not on [::1]", n.HTTPAddr())
	}
	mc := nodetest.ClientOf(n, 1)
	served0, handed0 := loopCounts(t, mc)
	r := dialRaw(t, n.HTTPAddr())
	var order any
	for i := range 2 {
		r.send(deductReq("loop", "", `{"user":"v6","request_id":"v6-1"}`))
		code, got, _ := r.answer()
		if code != 200 || (i == 1 && got["order_id"] != order) {
			t.Fatalf("deduct %d over IPv6: %d %v (first order %v)", i+1, code, got, order)
		}
		order = got["order_id"]
	}
	r.send("GET /v1/skus/loop HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, got, _ := r.answer(); code != 200 || got["remaining"] != 2.0 {
		t.Fatalf("read over IPv6: %d %v", code, got)
	}
	if served, handed := loopCounts(t, mc); served-served0 != 2 || handed-handed0 != 1 {
		t.Fatalf("loop served %v, handed over %v; want 2 and 1", served-served0, handed-handed0)
	}
	if a := nodetest.CheckLedger(t, mc, "loop"); a["sold"] != 1.0 || a["orders"] != 1.0 || a["orders_sold_units"] != a["sold"] {
		t.Fatalf("want one order of one unit: %v", a)
	}
}

// A crowd over the loop: more buyers than units over hundreds of
// connections, a share of request ids sent twice at once. No unit is sold
// twice, no buyer told two orders, the law holds.
func TestEventLoop_CrowdKeepsTheLaw(t *testing.T) {
	const units, buyers, conns, twiceEvery = 1500, 4000, 300, 10
	n := startLoopNode(t, units, nil)
	mc := nodetest.ClientOf(n, 1)
	client := nodetest.ClientOf(n, 2*conns) // room for the twins
	type answer struct {
		code  int
		order string
		err   string
	}
	var (
		mu      sync.Mutex
		answers = map[int][]answer{}
		wg      sync.WaitGroup
	)
	call := func(b int) {
		code, out := nodetest.CallWithin(client, 30*time.Second, "POST", "/v1/skus/loop/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, b, b))
		a := answer{code: code}
		a.order, _ = out["order_id"].(string)
		a.err, _ = out["error"].(string)
		mu.Lock()
		answers[b] = append(answers[b], a)
		mu.Unlock()
	}
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < buyers; b += conns {
				if b%twiceEvery == 0 {
					var twin sync.WaitGroup
					twin.Add(1)
					go func() { defer twin.Done(); call(b) }()
					call(b)
					twin.Wait()
					continue
				}
				call(b)
			}
		}()
	}
	wg.Wait()
	orders := map[string]int{}
	for b, got := range answers {
		var won string
		for _, a := range got {
			switch {
			case a.code == 200:
				if won != "" && won != a.order {
					t.Errorf("buyer %d told two orders: %s and %s", b, won, a.order)
				}
				won = a.order
			case a.code == 409 && a.err == "sold_out":
				if won != "" {
					t.Errorf("buyer %d told a win and sold_out", b)
				}
			default:
				t.Errorf("buyer %d: %d %s", b, a.code, a.err)
			}
		}
		if won != "" {
			if other, ok := orders[won]; ok && other != b {
				t.Errorf("order %s told to buyers %d and %d", won, other, b)
			}
			orders[won] = b
		}
	}
	if len(orders) != units {
		t.Errorf("%d orders acknowledged for %d units: oversold or undersold", len(orders), units)
	}
	a := nodetest.CheckLedger(t, nodetest.ClientOf(n, 1), "loop")
	if a["sold"] != float64(units) || a["orders"] != float64(units) {
		t.Fatalf("the ledger: %v, want %d units sold in %d orders", a, units, units)
	}
	if served, _ := loopCounts(t, mc); served < buyers+buyers/twiceEvery {
		t.Fatalf("the loop answered %v deducts of %d buyers: it was not the one serving", served, buyers)
	}
}

// A node stopped while the loop's deducts wait for a slow ledger answers
// each of them before it closes: the win it committed, or an error that
// says the outcome is unknown.
func TestEventLoop_StopAnswersDeductsInFlight(t *testing.T) {
	dir := t.TempDir()
	n := startLoopNodeIn(t, dir, 100, func(c *node.Config) { c.FaultApplyDelay = 300 * time.Millisecond })
	const inFlight = 20
	conns := make([]*rawConn, inFlight)
	for i := range conns {
		conns[i] = dialRaw(t, n.HTTPAddr())
		conns[i].send(deductReq("loop", "", fmt.Sprintf(`{"user":"s%d","request_id":"s%d"}`, i, i)))
	}
	nodetest.WaitFor(t, 10*time.Second, "the deducts in the ledger's queue", func() bool {
		m := nodetest.GetRaw(t, nodetest.ClientOf(n, 1), "/metrics")
		var waiting float64
		for _, line := range strings.Split(m, "\n") {
			fmt.Sscanf(line, "stockd_admission_waiting_commit %g", &waiting)
		}
		return waiting > 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- n.Stop(ctx) }()
	wins := 0
	for i, r := range conns {
		code, got, _ := r.answer()
		switch code {
		case 200:
			wins++
		case 503, 504:
		default:
			t.Errorf("deduct %d: %d %v", i, code, got)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	// Restarted on its data: every win answered is sold, no more units
	// than deducts were sent, and the law holds.
	again := nodetest.StartNode(t, dir)
	a := nodetest.CheckLedger(t, nodetest.ClientOf(again, 1), "loop")
	if sold := int(a["sold"].(float64)); sold < wins || sold > inFlight || a["orders"] != a["sold"] {
		t.Fatalf("%d wins answered, %d in flight; after a restart: %v", wins, inFlight, a)
	}
}

// A client that pipelines thousands of deducts into a small receive
// buffer, so that the loop's writes meet a full socket and its unwritten
// answers reach their bound: every answer still comes, in order.
func TestEventLoop_PipelinedFloodIntoASmallReceiveBuffer(t *testing.T) {
	n := startLoopNode(t, 10, nil)
	c := dialSmallReceiveBuffer(t, n.HTTPAddr())
	r := &rawConn{t: t, c: c, br: bufio.NewReaderSize(c, 512)}
	requests := floodRequests(t)
	var all strings.Builder
	for i := range requests {
		sku := "none" // sold out: 409
		if i%2 == 1 {
			sku = "nosuch" // 404
		}
		all.WriteString(deductReq(sku, "", fmt.Sprintf(`{"user":"f%d","request_id":"f%d"}`, i, i)))
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, all.String())
		wrote <- err
	}()
	// Read nothing until the loop stops answering: the answers
	// (floodRequests) outgrow the socket's buffers and the loop's bound on
	// unwritten answers, so it must wait for this client, then serve the
	// rest.
	mc := nodetest.ClientOf(n, 1)
	var last float64 = -1
	nodetest.WaitFor(t, 30*time.Second, "the loop to wait for the client to read", func() bool {
		served, _ := loopCounts(t, mc)
		stalled := served == last && served < float64(requests)
		last = served
		return stalled
	})
	for i := range requests {
		want := 409
		if i%2 == 1 {
			want = 404
		}
		if code, got, _ := r.answer(); code != want {
			t.Fatalf("answer %d: %d %v, want %d", i, code, got, want)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write the requests: %v", err)
	}
	if served, _ := loopCounts(t, mc); served != float64(requests) {
		t.Fatalf("the loop answered %v, want %d", served, requests)
	}
	nodetest.CheckLedger(t, mc, "none")
}

// A client that sends and never reads is closed once its answers have
// waited past the write timeout: the loop holds a bounded backlog for
// it, not a connection for ever.
func TestEventLoop_ClientThatNeverReadsIsClosedAfterTheWriteTimeout(t *testing.T) {
	n := startLoopNode(t, 10, func(c *node.Config) { c.HTTP.WriteTimeout = time.Second })
	c := dialSmallReceiveBuffer(t, n.HTTPAddr())
	var all strings.Builder
	requests := floodRequests(t)
	for i := range requests {
		all.WriteString(deductReq("none", "", fmt.Sprintf(`{"user":"w%d","request_id":"w%d"}`, i, i)))
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, all.String())
		wrote <- err
	}()
	mc := nodetest.ClientOf(n, 1)
	nodetest.WaitFor(t, 30*time.Second, "the loop to take the connection", func() bool {
		return loopConnections(t, mc) == 1
	})
	nodetest.WaitFor(t, 30*time.Second, "the loop to close the client that does not read", func() bool {
		return loopConnections(t, mc) == 0
	})
	<-wrote // written into the node's socket buffers, or refused once it closed
	// The client sees the close: its reads end before the deadline.
	if _, err := io.Copy(io.Discard, c); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client's connection stayed open: %v", err)
	}
	if served, _ := loopCounts(t, mc); served == 0 || served >= float64(requests) {
		t.Fatalf("the loop answered %v of %d before closing, want some and not all", served, requests)
	}
	nodetest.CheckLedger(t, mc, "none")
}

// floodRequests is how many deducts a client that does not read must
// send for their answers (about 170 bytes each) to outgrow the node's
// send buffer, the client's receive buffer and the loop's bound on
// unwritten answers: 40,000 (about 7 MB of answers) where the kernel lets
// a socket's send buffer grow to 4 MiB, as Linux does by default, and as
// many more as a larger tcp_wmem allows.
func floodRequests(t *testing.T) int {
	t.Helper()
	const base, baseBuffer = 40_000, 4 << 20
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return base
	}
	f := strings.Fields(string(b)) // min, default, max
	if len(f) != 3 {
		return base
	}
	most, err := strconv.Atoi(f[2])
	if err != nil || most <= baseBuffer {
		return base
	}
	n := base * ((most + baseBuffer - 1) / baseBuffer)
	t.Logf("tcp_wmem lets a send buffer grow to %d bytes: %d requests", most, n)
	return n
}

// loopConnections is the loop's stockd_http_event_loop_connections.
func loopConnections(t *testing.T, mc *fasthttp.HostClient) float64 {
	t.Helper()
	v := -1.0
	for _, line := range strings.Split(nodetest.GetRaw(t, mc, "/metrics"), "\n") {
		fmt.Sscanf(line, "stockd_http_event_loop_connections %g", &v)
	}
	return v
}

// dialSmallReceiveBuffer connects with a 4 KiB receive buffer, so that
// answers the client does not read soon fill its socket, and a minute's
// deadline.
func dialSmallReceiveBuffer(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return cmp.Or(err, serr)
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c
}
