package scenario

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/feed"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// feedEvent is one event of GET /v1/events as a consumer reads it.
type feedEvent struct {
	Cursor  string `json:"cursor"`
	Type    string `json:"type"`
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int64  `json:"qty"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
}

type feedPage struct {
	Events     []feedEvent `json:"events"`
	Next       string      `json:"next"`
	Head       string      `json:"head"`
	NodeBehind bool        `json:"node_behind"`
}

// feedSeq is the sequence part of a cursor "<index>-<seq>".
func feedSeq(t *testing.T, cursor string) (index, seq uint64) {
	t.Helper()
	i, s, ok := strings.Cut(cursor, "-")
	if !ok {
		t.Fatalf("cursor %q is not <index>-<seq>", cursor)
	}
	index, err1 := strconv.ParseUint(i, 10, 64)
	seq, err2 := strconv.ParseUint(s, 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("cursor %q is not <index>-<seq>", cursor)
	}
	return index, seq
}

// readEvents is one GET /v1/events; code 0: the node did not answer.
func readEvents(c *fasthttp.HostClient, after string, limit int, wait time.Duration) (int, feedPage, string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, fmt.Sprintf("/v1/events?after=%s&limit=%d&wait=%s", after, limit, wait)))
	if err := c.DoTimeout(req, resp, wait+5*time.Second); err != nil {
		return 0, feedPage{}, err.Error()
	}
	var p feedPage
	if resp.StatusCode() == 200 {
		if err := jsonUnmarshal(resp.Body(), &p); err != nil {
			return 0, p, err.Error()
		}
	}
	return resp.StatusCode(), p, string(resp.Body())
}

// feedConsumer is what a shop's order service does with the feed: it
// reads pages after its cursor from one node, moves to the next node when
// that one stops answering, acknowledges each page, and keeps its own
// tally of held and sold units.
type feedConsumer struct {
	t    *testing.T
	c    *nodetest.Cluster
	name string

	mu     sync.Mutex
	cursor string
	node   int // index into c.ids of the node it reads from
	feedTally
	moves int
	// readElsewhere counts events read after the first move.
	readElsewhere int
}

// feedTally is a consumer's own books: every event once, in log order,
// and the held and sold units per SKU they add up to.
type feedTally struct {
	seen   map[uint64]feedEvent
	list   []feedEvent
	last   [2]uint64 // index and seq of the last event
	orders map[string]feedEvent
	held   map[string]int64
	sold   map[string]int64
}

func newFeedTally() feedTally {
	return feedTally{seen: map[uint64]feedEvent{}, orders: map[string]feedEvent{}, held: map[string]int64{}, sold: map[string]int64{}}
}

func newFeedConsumer(t *testing.T, c *nodetest.Cluster, name string, startNode int) *feedConsumer {
	return &feedConsumer{t: t, c: c, name: name, cursor: "0", node: startNode, feedTally: newFeedTally()}
}

func (f *feedConsumer) reading() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.c.IDs[f.node]
}

// step reads one page (long-polling briefly) and acknowledges it. It
// returns the number of events read.
func (f *feedConsumer) step() int {
	f.mu.Lock()
	id, after := f.c.IDs[f.node], f.cursor
	f.mu.Unlock()
	cl := f.c.Client(id)
	code := 0
	var page feedPage
	var body string
	if cl != nil {
		code, page, body = readEvents(cl, after, 97, 200*time.Millisecond)
	}
	if code != 200 {
		if code != 0 && code != 503 {
			f.t.Errorf("consumer %s: read after %s from %s: %d %s", f.name, after, id, code, body)
		}
		f.mu.Lock()
		f.node = (f.node + 1) % len(f.c.IDs)
		f.moves++
		f.mu.Unlock()
		f.t.Logf("consumer %s: %s did not answer (%d); reading from %s after %s", f.name, id, code, f.reading(), after)
		return 0
	}
	f.mu.Lock()
	for _, e := range page.Events {
		f.add(f.t, e)
	}
	if f.moves > 0 {
		f.readElsewhere += len(page.Events)
	}
	f.cursor = page.Next
	cursor := f.cursor
	f.mu.Unlock()
	if len(page.Events) > 0 {
		// Acknowledged through whichever node answers (followers relay).
		for attempt := 0; attempt < len(f.c.IDs); attempt++ {
			if ac := f.c.Client(f.c.IDs[(f.node+attempt)%len(f.c.IDs)]); ac != nil {
				if code, _ := nodetest.CallQuiet(ac, "PUT", "/v1/consumers/"+f.name, `{"cursor":"`+cursor+`"}`); code == 200 {
					break
				}
			}
		}
	}
	return len(page.Events)
}

// add takes one event into the tally.
func (f *feedTally) add(t *testing.T, e feedEvent) {
	index, seq := feedSeq(t, e.Cursor)
	if _, dup := f.seen[seq]; dup {
		t.Errorf("event %s seen twice", e.Cursor)
		return
	}
	if seq != f.last[1]+1 || index < f.last[0] {
		t.Errorf("event %s after %d-%d: not the next in log order", e.Cursor, f.last[0], f.last[1])
	}
	f.seen[seq], f.last = e, [2]uint64{index, seq}
	f.list = append(f.list, e)
	prior, known := f.orders[e.OrderID]
	switch e.Type {
	case "order_created":
		if known {
			t.Errorf("order %s created twice", e.OrderID)
		}
		switch e.State {
		case "held":
			f.held[e.SKU] += e.Qty
		case "sold":
			f.sold[e.SKU] += e.Qty
		}
		f.orders[e.OrderID] = e
	case "order_confirmed":
		if !known || prior.State != "held" {
			t.Errorf("order %s confirmed from state %q", e.OrderID, prior.State)
		}
		f.held[e.SKU] -= e.Qty
		f.sold[e.SKU] += e.Qty
		f.orders[e.OrderID] = e
	case "order_released":
		if known {
			if prior.State != "held" {
				t.Errorf("order %s released from state %q", e.OrderID, prior.State)
			}
			f.held[e.SKU] -= e.Qty
			f.orders[e.OrderID] = e
		}
	default:
		t.Errorf("event %s of type %q", e.Cursor, e.Type)
	}
}

// TestFeed_ConsumerMovesToAnotherNodeWhenItsNodeDies runs a sale with
// holds (some confirmed, some cancelled, some left to expire) over three
// nodes while a consumer reads the order feed from one of them; that node
// is killed mid-sale and the consumer goes on from its cursor on another.
// At the end the consumer has seen every event once, in log order, and its
// tally of held and sold units is the ledger's.
func TestFeed_ConsumerMovesToAnotherNodeWhenItsNodeDies(t *testing.T) {
	const units, holdTTL = 240, 1500 * time.Millisecond
	c := nodetest.StartCluster(t)
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/feed", fmt.Sprintf(`{"total":%d,"hold_ttl":"%s"}`, units, holdTTL)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "feed")

	// The consumer reads from a follower.
	start := 0
	for i, id := range c.IDs {
		if id != c.Leader() {
			start = i
			break
		}
	}
	cons := newFeedConsumer(t, c, "shop", start)
	stop := make(chan struct{})
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for i := 0; i < 20000; i++ { // bounded; ends when told and caught up
			select {
			case <-stop:
				return
			default:
			}
			cons.step()
		}
	}()

	// Buyers hold units; half confirm, a quarter cancel, a quarter let the
	// hold expire.
	var confirmed, cancelled atomic.Int64
	settle := func(wave map[int]buyerResult) {
		var wg sync.WaitGroup
		i := 0
		for _, r := range wave {
			if r.code != 200 {
				continue
			}
			i++
			op := ""
			switch i % 4 {
			case 0, 1:
				op = "confirm"
			case 2:
				op = "cancel"
			default:
				continue // left to expire
			}
			wg.Add(1)
			go func(order, op string, n int) {
				defer wg.Done()
				for attempt := 0; attempt < 40; attempt++ {
					cl := c.Client(c.IDs[(n+attempt)%len(c.IDs)])
					if cl == nil {
						continue
					}
					code, _ := nodetest.CallQuiet(cl, "POST", "/v1/orders/"+order+"/"+op, "")
					if code == 200 {
						if op == "confirm" {
							confirmed.Add(1)
						} else {
							cancelled.Add(1)
						}
						return
					}
					if code == 409 {
						return // expired first
					}
					time.Sleep(50 * time.Millisecond)
				}
			}(r.order, op, i)
		}
		wg.Wait()
	}
	first := buyWave(c, "feed", 0, 160, 12, nil)
	settle(first)

	// Kill the node the consumer reads from, mid-sale.
	victim := cons.reading()
	nodetest.WaitFor(t, 20*time.Second, "the consumer to read part of the sale", func() bool {
		cons.mu.Lock()
		defer cons.mu.Unlock()
		return len(cons.seen) > 50
	})
	t.Logf("crashing %s, which the consumer reads from", victim)
	c.Crash(victim)
	second := buyWave(c, "feed", 1000, 1200, 12, nil)
	settle(second)
	// The victim stays down until the consumer has gone on elsewhere.
	nodetest.WaitFor(t, 30*time.Second, "the consumer to read on from another node", func() bool {
		cons.mu.Lock()
		defer cons.mu.Unlock()
		return cons.moves > 0 && cons.readElsewhere > 0
	})
	third := buyWave(c, "feed", 2000, 2200, 12, nil)
	settle(third)
	c.Start(victim, nil)
	nodetest.WaitReady(t, c)

	// Every hold left to expire expires; then the consumer catches up.
	nodetest.WaitFor(t, 30*time.Second, "every hold confirmed, cancelled or expired", func() bool {
		_, a := nodetest.Call(t, c.Client(c.IDs[0]), "GET", "/v1/skus/feed/audit", "")
		return a["held"] == 0.0
	})
	acked := ackedOrders(t, first, second, third)
	a := checkClusterLedgers(t, c, "feed", nil) // released orders are neither sold nor held
	var head string
	nodetest.WaitFor(t, 10*time.Second, "the feed's head", func() bool {
		code, p, _ := readEvents(c.Client(c.IDs[0]), "0", 1, 0)
		head = p.Head
		return code == 200 && head != "0"
	})
	_, headSeq := feedSeq(t, head)
	nodetest.WaitFor(t, 30*time.Second, "the consumer to reach the head", func() bool {
		cons.mu.Lock()
		defer cons.mu.Unlock()
		return cons.last[1] >= headSeq
	})
	close(stop)
	<-consumerDone

	cons.mu.Lock()
	defer cons.mu.Unlock()
	if cons.moves == 0 {
		t.Fatal("the consumer never moved to another node")
	}
	if uint64(len(cons.seen)) != headSeq {
		t.Fatalf("the consumer saw %d events; the feed's head is %d", len(cons.seen), headSeq)
	}
	if cons.held["feed"] != int64(a["held"].(float64)) || cons.sold["feed"] != int64(a["sold"].(float64)) {
		t.Fatalf("the consumer's tally: held %d sold %d; the ledger: held %v sold %v", cons.held["feed"], cons.sold["feed"], a["held"], a["sold"])
	}
	// Every acknowledged order has its creation in the feed.
	for o := range acked {
		if e, ok := cons.orders[o]; !ok {
			t.Fatalf("acknowledged order %s has no events", o)
		} else if e.Type == "order_created" && e.State != "held" {
			t.Fatalf("order %s created %s in a sale with holds", o, e.State)
		}
	}
	if cons.sold["feed"] != confirmed.Load() {
		t.Fatalf("%d orders confirmed, the feed sold %d", confirmed.Load(), cons.sold["feed"])
	}
	t.Logf("%d events, %d of them read after the consumer's node died; consumer moved %d times; %d confirmed, %d cancelled, sold %d", len(cons.seen), cons.readElsewhere, cons.moves, confirmed.Load(), cancelled.Load(), cons.sold["feed"])

	// The consumer reconciles its books with a node's order stream.
	reconcile(t, c.Client(victim), "feed", cons.orders, a)

	// The consumer's acknowledged cursor is replicated: every node reports it.
	for _, id := range c.IDs {
		nodetest.WaitFor(t, 10*time.Second, id+" to report the consumer's cursor", func() bool {
			_, out := nodetest.Call(t, c.Client(id), "GET", "/v1/consumers", "")
			cs, _ := out["consumers"].([]any)
			return len(cs) == 1 && cs[0].(map[string]any)["cursor"] == cons.cursor && cs[0].(map[string]any)["lag_events"] == 0.0
		})
	}
}

// logBuffer collects a node's log lines for a test to look at.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// metricFloat reads one series of a node's /metrics as a number.
func metricFloat(t *testing.T, c *fasthttp.HostClient, name string) float64 {
	t.Helper()
	v := metricValue(t, c, name)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("metric %s: %q", name, v)
	}
	return f
}

// TestFeed_AConsumerHoldsRetentionUpToTheCapAndNoFurther: events older
// than the retention stay while a consumer has not acknowledged them, up
// to the cap; beyond it the oldest go with a warning and a metric, and a
// cursor older than what is kept gets 410.
func TestFeed_AConsumerHoldsRetentionUpToTheCapAndNoFurther(t *testing.T) {
	const eventCap = 50
	logs := &logBuffer{}
	cfg := nodetest.NodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
	cfg.Engine.FeedRetention = time.Millisecond // only the consumer holds events
	cfg.Engine.FeedCap = eventCap
	cfg.Engine.FeedPruneInterval = 20 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(context.Background()) })
	cl := nodetest.ClientOf(n, 4)
	nodetest.WaitFor(t, 10*time.Second, "node ready", func() bool { code, _ := nodetest.Call(t, cl, "GET", "/readyz", ""); return code == 200 })
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/cap", `{"total":1000}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	buy := func(from, to int) {
		for b := from; b < to; b++ {
			if code, body := nodetest.Call(t, cl, "POST", "/v1/skus/cap/deduct", fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b)); code != 200 {
				t.Fatalf("deduct %d: %d %v", b, code, body)
			}
		}
	}
	// The consumer registers before the sale: it holds every event.
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/consumers/slow", `{"cursor":"0"}`); code != 200 {
		t.Fatalf("register: %d %v", code, body)
	}
	buy(0, 10)
	code, page, _ := readEvents(cl, "0", 100, 0)
	if code != 200 || len(page.Events) != 10 {
		t.Fatalf("first read: %d, %d events", code, len(page.Events))
	}
	slow := page.Events[9].Cursor // the consumer acknowledges 10 events, then stops
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/consumers/slow", `{"cursor":"`+slow+`"}`); code != 200 {
		t.Fatalf("ack: %d %v", code, body)
	}
	buy(10, 30)
	consumers := func() map[string]any {
		_, out := nodetest.Call(t, cl, "GET", "/v1/consumers", "")
		return out
	}
	// The leader prunes what the consumer acknowledged, and no further.
	nodetest.WaitFor(t, 10*time.Second, "pruning up to the consumer's cursor", func() bool { return consumers()["floor"] == slow })
	if out := consumers(); out["retained_events"] != 20.0 {
		t.Fatalf("after pruning to the consumer: %v", out)
	}
	if v := metricFloat(t, cl, "stockd_feed_unacknowledged_pruned_events_total"); v != 0 {
		t.Fatalf("%v unacknowledged events pruned below the cap", v)
	}

	// Past the cap the oldest events go even though the consumer has not
	// read them.
	buy(30, 90)
	nodetest.WaitFor(t, 10*time.Second, "pruning down to the cap", func() bool { return consumers()["retained_events"] == float64(eventCap) })
	out := consumers()
	if _, floor := feedSeq(t, out["floor"].(string)); floor != 90-eventCap {
		t.Fatalf("floor %v, want event %d", out["floor"], 90-eventCap)
	}
	lag := out["consumers"].([]any)[0].(map[string]any)
	if lag["cursor"] != slow || lag["lag_events"] != 80.0 {
		t.Fatalf("the consumer's lag: %v", lag)
	}
	// The leader counts what it pruned once its prune returns, a moment
	// after the floor moved.
	nodetest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d unacknowledged events pruned", 90-eventCap-10), func() bool {
		return metricFloat(t, cl, "stockd_feed_unacknowledged_pruned_events_total") == 90-eventCap-10
	})
	if v := metricFloat(t, cl, "stockd_feed_at_cap"); v != 1 {
		t.Fatalf("stockd_feed_at_cap %v", v)
	}
	if v := metricFloat(t, cl, `stockd_feed_consumer_lag_events{consumer="slow"}`); v != 80 {
		t.Fatalf("consumer lag metric %v", v)
	}
	if !strings.Contains(logs.String(), "order feed at its cap") || !strings.Contains(logs.String(), "consumer=slow") {
		t.Fatalf("no warning naming the consumer in the log:\n%s", logs.String())
	}

	// The consumer's cursor is older than what is kept: 410, for reads and acks.
	if code, _, body := readEvents(cl, slow, 10, 0); code != 410 || !strings.Contains(body, "cursor_expired") {
		t.Fatalf("read after an expired cursor: %d %s", code, body)
	}
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/consumers/slow", `{"cursor":"`+slow+`"}`); code != 410 {
		t.Fatalf("ack of an expired cursor: %d %v", code, body)
	}
	// From the start, a reader gets what is kept; bad cursors are 400.
	code, page, _ = readEvents(cl, "0", 1000, 0)
	if code != 200 || len(page.Events) != eventCap {
		t.Fatalf("read from the start: %d, %d events", code, len(page.Events))
	}
	for _, bad := range []string{"x", "5", "1-0", page.Events[3].Cursor + "0"} {
		if code, _, body := readEvents(cl, bad, 10, 0); code != 400 {
			t.Fatalf("cursor %q: %d %s", bad, code, body)
		}
	}
	// Dropping the consumer lets retention go back to time alone.
	if code, body := nodetest.Call(t, cl, "DELETE", "/v1/consumers/slow", ""); code != 200 {
		t.Fatalf("drop: %d %v", code, body)
	}
	nodetest.WaitFor(t, 10*time.Second, "time retention once the consumer is gone", func() bool { return consumers()["retained_events"] == 0.0 })
	nodetest.CheckLedger(t, cl, "cap")
}

// TestFeed_ExampleConsumerPrintsAndAcknowledges runs `stockd feed`, the
// example consumer, against a node: it prints every event once as a JSON
// line, acknowledges them, starts the next run where the last stopped, and
// skips a node that does not answer.
func TestFeed_ExampleConsumerPrintsAndAcknowledges(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 2)
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/ex", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	buy := func(from, to int) {
		for b := from; b < to; b++ {
			if code, body := nodetest.Call(t, cl, "POST", "/v1/skus/ex/deduct", fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b)); code != 200 {
				t.Fatalf("deduct %d: %d %v", b, code, body)
			}
		}
	}
	// A dead node first: the consumer moves on to the live one.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	consume := func() []feedEvent {
		t.Helper()
		var out, errs bytes.Buffer
		args := []string{"-target", deadURL + ",http://" + n.HTTPAddr(), "-consumer", "orders-svc", "-limit", "3", "-wait", "0s", "-exit-when-idle"}
		if err := feed.Main(context.Background(), args, &out, &errs); err != nil {
			t.Fatalf("stockd feed: %v: %s", err, errs.String())
		}
		var events []feedEvent
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if line == "" {
				continue
			}
			var e feedEvent
			if err := jsonUnmarshal([]byte(line), &e); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			events = append(events, e)
		}
		return events
	}
	buy(0, 7)
	first := consume()
	if len(first) != 7 {
		t.Fatalf("first run printed %d events, want 7", len(first))
	}
	for i, e := range first {
		if _, seq := feedSeq(t, e.Cursor); seq != uint64(i+1) || e.Type != "order_created" || e.State != "sold" {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	buy(7, 10)
	second := consume()
	if len(second) != 3 || second[0].Cursor == first[6].Cursor {
		t.Fatalf("second run printed %+v; it should start after the acknowledged cursor %s", second, first[6].Cursor)
	}
	_, out := nodetest.Call(t, cl, "GET", "/v1/consumers", "")
	cs := out["consumers"].([]any)
	if len(cs) != 1 || cs[0].(map[string]any)["cursor"] != second[2].Cursor {
		t.Fatalf("consumers after two runs: %v", out)
	}
	reconcile(t, cl, "ex", nil, nodetest.CheckLedger(t, cl, "ex"))
	if code, _ := nodetest.Call(t, cl, "GET", "/v1/skus/nope/orders", ""); code != 404 {
		t.Fatalf("orders of an unknown sale: %d", code)
	}
	if code, _ := nodetest.Call(t, cl, "GET", "/v1/skus/ex/orders?state=lost", ""); code != 400 {
		t.Fatalf("orders in a bad state: %d", code)
	}
}

// checkFeedEverywhere reads the whole order feed from every node (which
// have applied the same index) and fails unless every node serves the same
// events, each once and in log order, and they tally to the sale's held
// and sold units in audit.
func checkFeedEverywhere(t *testing.T, sc nodetest.SalesCluster, sku string, audit map[string]any) {
	t.Helper()
	var ref []feedEvent
	for i, id := range sc.NodeIDs() {
		tally := newFeedTally()
		after := "0"
		for pages := 0; ; pages++ {
			if pages > 10_000 {
				t.Fatalf("%s: the feed does not end", id)
			}
			code, p, body := readEvents(sc.Client(id), after, 1000, 0)
			if code != 200 {
				t.Fatalf("%s: read the feed after %s: %d %s", id, after, code, body)
			}
			if len(p.Events) == 0 {
				break
			}
			for _, e := range p.Events {
				tally.add(t, e)
			}
			after = p.Next
		}
		if held, sold := tally.held[sku], tally.sold[sku]; float64(held) != audit["held"] || float64(sold) != audit["sold"] {
			t.Fatalf("%s: the feed tallies %s to held %d sold %d; the ledger holds %v sold %v", id, sku, held, sold, audit["held"], audit["sold"])
		}
		if i == 0 {
			ref = tally.list
			continue
		}
		if len(tally.list) != len(ref) {
			t.Fatalf("%s serves %d feed events, %s %d", id, len(tally.list), sc.NodeIDs()[0], len(ref))
		}
		for k := range ref {
			if tally.list[k] != ref[k] {
				t.Fatalf("feed event %d differs: %s has %+v, %s %+v", k, id, tally.list[k], sc.NodeIDs()[0], ref[k])
			}
		}
	}
}

// streamOrders reads GET /v1/skus/{sku}/orders?query: the orders, and the
// stream's last line.
func streamOrders(t *testing.T, c *fasthttp.HostClient, sku, query string) ([]map[string]any, map[string]any) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, "/v1/skus/"+sku+"/orders?"+query))
	if err := c.DoTimeout(req, resp, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != 200 {
		t.Fatalf("orders of %s?%s: %d %s", sku, query, resp.StatusCode(), resp.Body())
	}
	lines := strings.Split(strings.TrimSpace(string(resp.Body())), "\n")
	var orders []map[string]any
	for _, line := range lines[:len(lines)-1] {
		var o map[string]any
		if err := jsonUnmarshal([]byte(line), &o); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		orders = append(orders, o)
	}
	var end map[string]any
	if err := jsonUnmarshal([]byte(lines[len(lines)-1]), &end); err != nil || end["done"] != true {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if int(end["orders"].(float64)) != len(orders) {
		t.Fatalf("the stream says %v orders, it held %d", end["orders"], len(orders))
	}
	return orders, end
}

// reconcile checks a consumer's books against a node's order stream: the
// same orders in the same states, and the stream's units by state are the
// ledger's held and sold.
func reconcile(t *testing.T, c *fasthttp.HostClient, sku string, books map[string]feedEvent, audit map[string]any) {
	t.Helper()
	orders, end := streamOrders(t, c, sku, "")
	units := map[string]float64{}
	for _, o := range orders {
		id, state := o["order_id"].(string), o["state"].(string)
		units[state] += o["qty"].(float64)
		if books != nil && books[id].State != state {
			t.Fatalf("order %s: the stream says %s, the consumer's books %q", id, state, books[id].State)
		}
	}
	if units["held"] != audit["held"] || units["sold"] != audit["sold"] {
		t.Fatalf("the order stream of %s holds %v held and %v sold; the ledger %v and %v", sku, units["held"], units["sold"], audit["held"], audit["sold"])
	}
	if books != nil {
		n := 0
		for _, e := range books { // real orders only: a turned-down take never enters the books
			if e.SKU == sku {
				n++
			}
		}
		if n != len(orders) {
			t.Fatalf("the consumer's books hold %d orders of %s, the stream %d", n, sku, len(orders))
		}
	}
	// Filtered by state, and resumed after an order id.
	sold, _ := streamOrders(t, c, sku, "state=sold")
	for _, o := range sold {
		if o["state"] != "sold" {
			t.Fatalf("state=sold streamed %v", o)
		}
	}
	if float64(len(sold)) > units["sold"] {
		t.Fatalf("%d sold orders for %v sold units", len(sold), units["sold"])
	}
	if len(orders) > 2 {
		rest, _ := streamOrders(t, c, sku, "after="+orders[1]["order_id"].(string))
		if len(rest) != len(orders)-2 || rest[0]["order_id"] != orders[2]["order_id"] {
			t.Fatalf("resumed after the second order: %d orders from %v", len(rest), rest[0]["order_id"])
		}
	}
	if end["feed_cursor"] == "0" || end["applied_index"].(float64) == 0 {
		t.Fatalf("the stream's end line: %v", end)
	}
}

// TestFeed_ClosedSaleArchivedAcrossTheCluster: a closed sale turns buyers
// away; it is archived once its consumer has acknowledged its events; its
// orders then leave every node's ledger and its totals stay.
func TestFeed_ClosedSaleArchivedAcrossTheCluster(t *testing.T) {
	const units = 150
	c := nodetest.StartCluster(t)
	cl := c.Client(c.IDs[0])
	for _, sku := range []string{"old", "new"} {
		if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
		waitForSaleEverywhere(t, c, sku)
	}
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/consumers/shop", `{"cursor":"0"}`); code != 200 {
		t.Fatalf("register consumer: %d %v", code, body)
	}
	wave := buyWave(c, "old", 0, units, 8, nil)
	acked := ackedOrders(t, wave)
	buyWave(c, "new", 1000, 1050, 8, nil)

	// Archive needs the sale closed, then its events acknowledged.
	if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/old/archive", ""); code != 409 || out["error"] != "not_closed" {
		t.Fatalf("archive of an open sale: %d %v", code, out)
	}
	if code, out := nodetest.Call(t, c.Client(c.IDs[1]), "POST", "/v1/skus/old/close", ""); code != 200 || out["state"] != "closed" {
		t.Fatalf("close through %s: %d %v", c.IDs[1], code, out)
	}
	for _, id := range c.IDs {
		nodetest.WaitFor(t, 10*time.Second, id+" to see the sale closed", func() bool {
			code, out := nodetest.Call(t, c.Client(id), "POST", "/v1/skus/old/deduct", `{"user":"late","request_id":"late-`+id+`"}`)
			return code == 409 && out["error"] == "closed"
		})
	}
	if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/old/archive", ""); code != 409 || out["error"] != "unconsumed_events" {
		t.Fatalf("archive with unacknowledged events: %d %v", code, out)
	}
	_, page, _ := readEvents(cl, "0", 1000, 0)
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/consumers/shop", `{"cursor":"`+page.Head+`"}`); code != 200 {
		t.Fatalf("ack: %d %v", code, body)
	}
	before := nodetest.CheckLedger(t, cl, "old")
	if code, out := nodetest.Call(t, c.Client(c.IDs[2]), "POST", "/v1/skus/old/archive", ""); code != 200 || out["archived"] != true {
		t.Fatalf("archive through %s: %d %v", c.IDs[2], code, out)
	}
	// Every node first: an order read on one node may be asked of the
	// node that minted it.
	for _, id := range c.IDs {
		nodetest.WaitFor(t, 20*time.Second, id+" to take the archived orders out", func() bool {
			_, out := nodetest.Call(t, c.Client(id), "GET", "/v1/skus/old", "")
			return out["archive_done"] == true
		})
	}
	for _, id := range c.IDs {
		_, out := nodetest.Call(t, c.Client(id), "GET", "/v1/skus/old", "")
		if out["archived_orders"] != float64(units) || out["sold"] != before["sold"] || out["total"] != before["total"] {
			t.Fatalf("%s: archived sale %v; before %v", id, out, before)
		}
		for o := range acked {
			if code, _ := nodetest.Call(t, c.Client(id), "GET", "/v1/orders/"+o, ""); code != 404 {
				t.Fatalf("%s: archived order %s: %d", id, o, code)
			}
			break
		}
		if orders, _ := streamOrders(t, c.Client(id), "old", ""); len(orders) != 0 {
			t.Fatalf("%s streams %d orders of the archived sale", id, len(orders))
		}
	}
	a := checkClusterLedgers(t, c, "old", nil)
	if a["orders"] != 0.0 || a["sold"] != float64(units) {
		t.Fatalf("audit of the archived sale: %v", a)
	}
	checkClusterLedgers(t, c, "new", nil)
	if orders, _ := streamOrders(t, cl, "new", ""); len(orders) != 50 {
		t.Fatalf("the other sale streams %d orders, want 50", len(orders))
	}
}

// TestFeed_ACursorAheadOfALaggingNodeWaitsForIt: a consumer that read on
// from a node ahead of the one it now asks is not refused: the lagging
// node says it is behind, and a long-poll answers once it has caught up.
func TestFeed_ACursorAheadOfALaggingNodeWaitsForIt(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	var lagging string
	for _, id := range c.IDs {
		if id != leader {
			lagging = id
			break
		}
	}
	if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/lag", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "lag")
	c.Net.Isolate(lagging)
	for b := range 20 {
		if code, body := nodetest.Call(t, c.Client(leader), "POST", "/v1/skus/lag/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"lag-%d"}`, b, b)); code != 200 {
			t.Fatalf("deduct %d: %d %v", b, code, body)
		}
	}
	code, page, _ := readEvents(c.Client(leader), "0", 1000, 0)
	if code != 200 || len(page.Events) < 20 {
		t.Fatalf("read on the leader: %d, %d events", code, len(page.Events))
	}
	fifth := page.Events[4].Cursor
	code, behind, body := readEvents(c.Client(lagging), fifth, 100, 200*time.Millisecond)
	if code != 200 || !behind.NodeBehind || len(behind.Events) != 0 || behind.Next != fifth {
		t.Fatalf("a cursor ahead of the isolated node: %d %s", code, body)
	}
	type result struct {
		code int
		page feedPage
	}
	got := make(chan result, 1)
	go func() {
		code, p, _ := readEvents(c.Client(lagging), fifth, 100, 20*time.Second)
		got <- result{code, p}
	}()
	c.Net.Heal(lagging)
	r := <-got
	if r.code != 200 || r.page.NodeBehind || len(r.page.Events) == 0 {
		t.Fatalf("the long-poll after the node caught up: %d %+v", r.code, r.page)
	}
	if _, seq := feedSeq(t, r.page.Events[0].Cursor); seq != 6 || r.page.Events[0].OrderID != page.Events[5].OrderID {
		t.Fatalf("the caught-up node went on with %+v, want event 6 %+v", r.page.Events[0], page.Events[5])
	}
	checkClusterLedgers(t, c, "lag", nil)
}
