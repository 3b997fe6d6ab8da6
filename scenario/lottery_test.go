package scenario

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// enterAll enters every user into lottery sku, user i through node i mod
// the cluster's size, from workers goroutines; every tenth user also
// enters at once through the next node, racing the first call. With
// faults it retries answers that promise nothing (429, 503, 504, no
// answer) on the next node; without, every call must answer 202. It
// returns each user's entry id, failing when two calls of one user got
// two ids.
func enterAll(t *testing.T, c *nodetest.Cluster, sku string, users []string, workers int, faults bool, acked *atomic.Int64) map[string]string {
	t.Helper()
	var mu sync.Mutex
	ids := map[string]string{}
	// The cluster's pools hold 32 connections a node; the entrants need
	// more, and wait for one rather than fail.
	pools := map[string]*fasthttp.HostClient{}
	pool := func(id string) *fasthttp.HostClient {
		cl := c.Client(id)
		if cl == nil {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if p, ok := pools[cl.Addr]; ok {
			return p
		}
		p := &fasthttp.HostClient{Addr: cl.Addr, MaxConns: 4 * workers, MaxConnWaitTimeout: 10 * time.Second,
			ReadTimeout: 15 * time.Second, WriteTimeout: 5 * time.Second}
		pools[cl.Addr] = p
		return p
	}
	var failed atomic.Int64
	enter := func(node int, user string) {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			cl := pool(c.IDs[node%len(c.IDs)])
			if cl == nil {
				node++
				continue
			}
			code, body := nodetest.CallQuiet(cl, "POST", "/v1/skus/"+sku+"/enter", fmt.Sprintf(`{"user":%q,"request_id":"r-%s"}`, user, user))
			switch code {
			case 202:
				id, _ := body["entry_id"].(string)
				mu.Lock()
				defer mu.Unlock()
				if prev, ok := ids[user]; ok && prev != id {
					t.Errorf("user %s entered twice: entries %s and %s", user, prev, id)
				}
				ids[user] = id
				if acked != nil {
					acked.Add(1)
				}
				return
			case 0, 429, 503, 504:
				if !faults {
					break
				}
				node++
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if failed.Add(1) <= 5 {
				t.Errorf("enter %s: %d %v", user, code, body)
			}
			return
		}
		t.Errorf("enter %s: no answer within 30s", user)
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if i%10 != 0 {
					enter(i, users[i])
					continue
				}
				var race sync.WaitGroup
				race.Add(2)
				go func() { defer race.Done(); enter(i, users[i]) }()
				go func() { defer race.Done(); enter(i+1, users[i]) }()
				race.Wait()
			}
		}()
	}
	for i := range users {
		work <- i
	}
	close(work)
	wg.Wait()
	return ids // the caller fails now if t.Failed(): this may run off the test's goroutine
}

// recomputedDraw is a lottery's draw as the test recomputes it from GET
// .../draw and the exported entries, with the algorithm docs/feed-and-lottery.md gives.
type recomputedDraw struct {
	draw   map[string]any
	ranked []string // users, best first
	seq    map[string]string
}

func recomputeDraw(t *testing.T, cl *fasthttp.HostClient, sku string) recomputedDraw {
	t.Helper()
	code, draw := nodetest.Call(t, cl, "GET", "/v1/skus/"+sku+"/draw", "")
	if code != 200 {
		t.Fatalf("draw of %s: %d %v", sku, code, draw)
	}
	seed, err1 := hex.DecodeString(draw["seed"].(string))
	commitment, err2 := hex.DecodeString(draw["seed_commitment"].(string))
	if sum := sha256.Sum256(seed); err1 != nil || err2 != nil || !bytes.Equal(sum[:], commitment) {
		t.Fatalf("the revealed seed %x does not hash to the commitment %x", seed, commitment)
	}

	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + cl.Addr + "/v1/skus/" + sku + "/entries")
	if err := cl.DoTimeout(req, resp, 30*time.Second); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("entries of %s: %v %d", sku, err, resp.StatusCode())
	}
	lines := strings.Split(strings.TrimSpace(string(resp.Body())), "\n")
	hash := make([]byte, 32)
	var users []string
	seqOf := map[string]string{}
	for i, line := range lines[:len(lines)-1] {
		var e struct {
			EntryID string `json:"entry_id"`
			Seq     int    `json:"seq"`
			User    string `json:"user"`
		}
		if err := jsonUnmarshal([]byte(line), &e); err != nil || e.Seq != i+1 || e.EntryID != fmt.Sprint(e.Seq) {
			t.Fatalf("entry line %d %q: %v (not in log order?)", i, line, err)
		}
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(e.User)))
		sum := sha256.Sum256(slices.Concat(hash, n[:], []byte(e.User)))
		hash = sum[:]
		users = append(users, e.User)
		seqOf[e.User] = e.EntryID
	}
	var end map[string]any
	if err := jsonUnmarshal([]byte(lines[len(lines)-1]), &end); err != nil || end["done"] != true || int(end["entries"].(float64)) != len(users) {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if got := hex.EncodeToString(hash); got != draw["entries_hash"] || int(draw["entries"].(float64)) != len(users) {
		t.Fatalf("entries hash recomputed %s over %d entries; the draw says %v over %v", got, len(users), draw["entries_hash"], draw["entries"])
	}
	type keyed struct {
		key  []byte
		user string
		seq  int
	}
	keys := make([]keyed, len(users))
	for i, u := range users {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], uint64(i+1))
		sum := sha256.Sum256(slices.Concat(seed, hash, s[:]))
		keys[i] = keyed{sum[:], u, i + 1}
	}
	slices.SortFunc(keys, func(a, b keyed) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	out := recomputedDraw{draw: draw, seq: seqOf}
	for _, k := range keys {
		out.ranked = append(out.ranked, k.user)
	}
	return out
}

// checkStandings asserts every user's standing on a running node (the
// winners' and the waitlist head's on every one):
// the first won entries (by the recomputed ranking) won, with an order of
// theirs; the rest waitlisted in order, or lost. It returns the winners'
// order ids by user.
func checkStandings(t *testing.T, c *nodetest.Cluster, sku string, d recomputedDraw, won int, lost bool) map[string]string {
	t.Helper()
	nodetest.WaitFor(t, 20*time.Second, "every node at the same applied index", func() bool {
		index := -1.0
		for _, id := range c.IDs {
			if cl := c.Client(id); cl != nil {
				code, a := nodetest.CallQuiet(cl, "GET", "/v1/skus/"+sku+"/audit", "")
				if code != 200 || (index >= 0 && a["applied_index"] != index) {
					return false
				}
				index = a["applied_index"].(float64)
			}
		}
		return true
	})
	orders := map[string]string{}
	var mu sync.Mutex
	var bad atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rank := range work {
				user := d.ranked[rank]
				var firstOrder string
				for j, id := range c.IDs {
					cl := c.Client(id)
					// Every standing on one node; the winners, the head of
					// the waitlist and every 25th on each node.
					if cl == nil || (j != rank%len(c.IDs) && rank >= won+200 && rank%25 != 0) {
						continue
					}
					code, st := nodetest.CallQuiet(cl, "GET", "/v1/skus/"+sku+"/entries/"+user, "")
					ok := code == 200 && st["entry_id"] == d.seq[user] && st["rank"] == float64(rank+1)
					switch {
					case rank < won:
						order, _ := st["order_id"].(string)
						ok = ok && st["state"] == "won" && order != "" && (firstOrder == "" || order == firstOrder)
						firstOrder = order
					case lost:
						ok = ok && st["state"] == "lost"
					default:
						ok = ok && st["state"] == "waitlisted" && st["position"] == float64(rank+1-won)
					}
					if !ok && bad.Add(1) <= 5 {
						t.Errorf("%s (rank %d) on %s: %d %v; want %d winners, lost %v", user, rank+1, id, code, st, won, lost)
					}
				}
				if firstOrder != "" {
					code, o := nodetest.CallQuiet(c.Client(c.IDs[rank%len(c.IDs)]), "GET", "/v1/orders/"+firstOrder, "")
					if code != 200 || o["user"] != user || o["sku"] != sku {
						t.Errorf("%s's order %s: %d %v", user, firstOrder, code, o)
					}
					mu.Lock()
					orders[user] = firstOrder
					mu.Unlock()
				}
			}
		}()
	}
	for rank := range d.ranked {
		work <- rank
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return orders
}

// checkDrawEverywhere asserts every running node shows the same draw.
func checkDrawEverywhere(t *testing.T, c *nodetest.Cluster, sku string, want map[string]any) {
	t.Helper()
	for _, id := range c.IDs {
		if cl := c.Client(id); cl != nil {
			nodetest.WaitFor(t, 10*time.Second, "the draw on "+id, func() bool {
				code, _ := nodetest.CallQuiet(cl, "GET", "/v1/skus/"+sku+"/draw", "")
				return code == 200
			})
			_, d := nodetest.Call(t, cl, "GET", "/v1/skus/"+sku+"/draw", "")
			for _, k := range []string{"seed", "entries_hash", "entries", "winners", "drawn_at", "seed_commitment"} {
				if d[k] != want[k] {
					t.Fatalf("%s's draw differs on %s: %v, want %v", id, k, d[k], want[k])
				}
			}
		}
	}
}

func lotteryUsers(n int) []string {
	users := make([]string, n)
	for i := range users {
		users[i] = fmt.Sprintf("fan-%05d", i)
	}
	return users
}

// TestLottery_TenThousandEntrantsForAHundredUnits: entrants over three
// nodes, the draw recomputed from the export, half the winners let their
// holds lapse and the next fifty on the waitlist get orders, then the
// rest lose.
func TestLottery_TenThousandEntrantsForAHundredUnits(t *testing.T) {
	testTenThousandEntrants(t, false)
}

// TestLottery_TenThousandEntrantsLeaderKilledAtTheClose is the same with
// the leader crashed as entries close: the next leader draws, once, and the
// crashed node, restarted, shows the same winners.
func TestLottery_TenThousandEntrantsLeaderKilledAtTheClose(t *testing.T) {
	testTenThousandEntrants(t, true)
}

func testTenThousandEntrants(t *testing.T, killLeaderAtClose bool) {
	const units, entrants = 100, 10_000
	// The holds outlast the first check of every standing on every node
	// (and, with a kill, the election and the restart before it).
	entriesOpen, holdTTL := 12*time.Second, 8*time.Second
	if killLeaderAtClose {
		holdTTL = 15 * time.Second
	}
	if raceEnabled {
		entriesOpen, holdTTL = 20*time.Second, holdTTL+15*time.Second
	}
	c := nodetest.StartCluster(t)
	closeAt := time.Now().Add(entriesOpen)
	code, sale := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/lot", fmt.Sprintf(`{"total":%d,"mode":"lottery","entries_close_at":%q,"hold_ttl":"%s"}`,
		units, closeAt.UTC().Format(time.RFC3339Nano), holdTTL))
	if code != 201 {
		t.Fatalf("create lottery: %d %v", code, sale)
	}
	commitment := sale["lottery"].(map[string]any)["seed_commitment"]
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/plain", `{"total":5}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "lot")
	waitForSaleEverywhere(t, c, "plain")

	start := time.Now()
	users := lotteryUsers(entrants)
	ids := enterAll(t, c, "lot", users, 48, false, nil)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d entrants entered in %s", len(ids), time.Since(start).Round(time.Millisecond))
	if len(ids) != entrants {
		t.Fatalf("%d entries acknowledged, want %d", len(ids), entrants)
	}
	// A repeat on any node is the first entry; the sale takes no deduct,
	// a sale that is no lottery takes no entry.
	for i, id := range c.IDs {
		user := users[i*7]
		if code, body := nodetest.Call(t, c.Client(id), "POST", "/v1/skus/lot/enter", `{"user":"`+user+`"}`); code != 202 || body["entry_id"] != ids[user] {
			t.Fatalf("repeat entry of %s on %s: %d %v, want entry %s", user, id, code, body, ids[user])
		}
	}
	if code, body := nodetest.Call(t, c.Client("n2"), "POST", "/v1/skus/lot/deduct", `{"user":"u1"}`); code != 409 || body["error"] != "lottery_sale" {
		t.Fatalf("deduct on a lottery: %d %v", code, body)
	}
	if code, body := nodetest.Call(t, c.Client("n2"), "POST", "/v1/skus/plain/enter", `{"user":"u1"}`); code != 409 || body["error"] != "not_a_lottery" {
		t.Fatalf("entry into a plain sale: %d %v", code, body)
	}
	if code, body := nodetest.Call(t, c.Client("n3"), "GET", "/v1/skus/lot/draw", ""); code != 409 {
		t.Fatalf("draw before the close: %d %v", code, body)
	}

	if killLeaderAtClose {
		nodetest.WaitFor(t, time.Until(closeAt)+5*time.Second, "the close", func() bool { return !time.Now().Before(closeAt) })
		leader := c.Leader()
		c.Crash(leader)
		t.Logf("crashed leader %s at the close", leader)
		nodetest.WaitFor(t, 15*time.Second, "a new leader", func() bool { return c.Leader() != "" })
		survivor := c.IDs[0]
		if survivor == leader {
			survivor = c.IDs[1]
		}
		nodetest.WaitFor(t, 20*time.Second, "the draw after the failover", func() bool {
			code, _ := nodetest.CallQuiet(c.Client(survivor), "GET", "/v1/skus/lot/draw", "")
			return code == 200
		})
		c.Start(leader, nil)
		nodetest.WaitReady(t, c)
	}
	nodetest.WaitFor(t, entriesOpen+20*time.Second, "the draw on every node", func() bool {
		for _, id := range c.IDs {
			if code, _ := nodetest.CallQuiet(c.Client(id), "GET", "/v1/skus/lot/draw", ""); code != 200 {
				return false
			}
		}
		return true
	})
	if code, body := nodetest.Call(t, c.Client("n3"), "POST", "/v1/skus/lot/enter", `{"user":"late-comer"}`); code != 409 || body["error"] != "entries_closed" {
		t.Fatalf("entry after the close: %d %v", code, body)
	}
	d := recomputeDraw(t, c.Client("n3"), "lot")
	if d.draw["seed_commitment"] != commitment || d.draw["winners"] != float64(units) {
		t.Fatalf("draw %v; commitment at creation %v", d.draw, commitment)
	}
	checkDrawEverywhere(t, c, "lot", d.draw)
	orders := checkStandings(t, c, "lot", d, units, false)

	// Half the winners pay; the other half let their holds lapse.
	acked := map[string]bool{}
	for rank, user := range d.ranked[:units] {
		if rank%2 == 1 {
			continue
		}
		if code, o := nodetest.Call(t, c.Client(c.IDs[rank%3]), "POST", "/v1/orders/"+orders[user]+"/confirm", ""); code != 200 || o["state"] != "sold" {
			t.Fatalf("confirm %s's order: %d %v", user, code, o)
		}
		acked[orders[user]] = true
	}
	nodetest.WaitFor(t, holdTTL+15*time.Second, "the lapsed winners' units on the waitlist", func() bool {
		_, v := nodetest.CallQuiet(c.Client("n1"), "GET", "/v1/skus/lot", "")
		lt, _ := v["lottery"].(map[string]any)
		return lt != nil && lt["promoted"] == float64(units/2)
	})
	orders = checkStandings(t, c, "lot", d, units+units/2, false)
	for rank, user := range d.ranked[units : units+units/2] {
		if code, o := nodetest.Call(t, c.Client(c.IDs[rank%3]), "POST", "/v1/orders/"+orders[user]+"/confirm", ""); code != 200 || o["state"] != "sold" {
			t.Fatalf("confirm promoted %s's order: %d %v", user, code, o)
		}
		acked[orders[user]] = true
	}
	// Nothing is held any more: no unit can come back, the rest lose.
	checkStandings(t, c, "lot", d, units+units/2, true)
	a := checkClusterLedgers(t, c, "lot", acked)
	if a["sold"] != float64(units) || a["held"] != 0.0 || a["orders"] != float64(units+units/2) {
		t.Fatalf("ledger after the lottery: %v", a)
	}
}

// TestLottery_BadInputGetsClearAnswers: each way to get a lottery call
// wrong has its own answer, and none of them changes the ledger.
func TestLottery_BadInputGetsClearAnswers(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 4)
	soon := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	later := time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct{ body, why string }{
		{`{"total":5,"mode":"lottery"}`, "no entries_close_at"},
		{`{"total":5,"mode":"lottery","entries_close_at":"tomorrow"}`, "entries_close_at not RFC 3339"},
		{`{"total":5,"mode":"raffle","entries_close_at":"` + soon + `"}`, "unknown mode"},
		{`{"total":5,"entries_close_at":"` + soon + `"}`, "entries_close_at without the lottery mode"},
		{`{"total":5,"mode":"lottery","entries_close_at":"` + soon + `","start_at":"` + later + `"}`, "entries close before the start"},
		{`{"total":5,"mode":"lottery","entries_close_at":"` + soon + `","per_user":2}`, "per_user on a lottery"},
	} {
		if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/bad", tc.body); code != 400 {
			t.Fatalf("%s: %d %v, want 400", tc.why, code, body)
		}
	}
	if code, _ := nodetest.Call(t, cl, "GET", "/v1/skus/bad", ""); code != 404 {
		t.Fatalf("a refused sale exists: %d", code)
	}
	if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/later", `{"total":5,"mode":"lottery","start_at":"`+soon+`","entries_close_at":"`+later+`"}`); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	for _, tc := range []struct {
		method, path, body string
		code               int
		errCode            string
	}{
		{"POST", "/v1/skus/later/enter", `{"user":"a"}`, 425, "not_started"},
		{"POST", "/v1/skus/later/enter", `{"user":""}`, 400, "bad_request"},
		// A user id follows the deduct's rule: any UTF-8 text without
		// control characters, given once; an entry takes no qty.
		{"POST", "/v1/skus/later/enter", `{"user":"a b"}`, 425, "not_started"},
		{"POST", "/v1/skus/later/enter", `{"user":"a\u0000"}`, 400, "bad_request"},
		{"POST", "/v1/skus/later/enter", `{"user":"a","user":"b"}`, 400, "bad_request"},
		{"POST", "/v1/skus/later/enter", `{"user":"a","qty":2}`, 400, "bad_request"},
		{"POST", "/v1/skus/later/enter", `not json`, 400, "bad_request"},
		{"POST", "/v1/skus/nope/enter", `{"user":"a"}`, 404, "unknown_sku"},
		{"GET", "/v1/skus/later/enter", ``, 405, ""},
		{"GET", "/v1/skus/later/draw", ``, 409, "not_drawn"},
		{"GET", "/v1/skus/nope/draw", ``, 404, "not_found"},
		{"GET", "/v1/skus/later/entries/a", ``, 404, "not_found"},
		{"GET", "/v1/skus/later/entries/a%20b", ``, 404, "not_found"},
		{"GET", "/v1/skus/later/entries/a%00b", ``, 400, "bad_request"},
		{"GET", "/v1/skus/nope/entries", ``, 404, "not_found"},
	} {
		code, body := nodetest.Call(t, cl, tc.method, tc.path, tc.body)
		if code != tc.code || (tc.errCode != "" && body["error"] != tc.errCode) {
			t.Fatalf("%s %s %s: %d %v, want %d %s", tc.method, tc.path, tc.body, code, body, tc.code, tc.errCode)
		}
	}
	_, v := nodetest.Call(t, cl, "GET", "/v1/skus/later", "")
	if lt := v["lottery"].(map[string]any); lt["entries"] != 0.0 || lt["state"] != "entering" || v["state"] != "upcoming" {
		t.Fatalf("the lottery after refused calls: %v", v)
	}
	nodetest.CheckLedger(t, cl, "later")
}

// TestLottery_EntriesThroughALeaderCrash crashes the leader while
// entrants pour in: an entrant whose answer was lost enters again,
// anywhere, and gets their one entry; every acknowledged entry is in the
// export once, under the id it was acknowledged with, and every node
// draws the same.
func TestLottery_EntriesThroughALeaderCrash(t *testing.T) {
	const units, entrants = 50, 3000
	entriesOpen := 15 * time.Second
	if raceEnabled {
		entriesOpen = 30 * time.Second
	}
	c := nodetest.StartCluster(t)
	closeAt := time.Now().Add(entriesOpen)
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/crash", fmt.Sprintf(`{"total":%d,"mode":"lottery","entries_close_at":%q,"hold_ttl":"1h"}`,
		units, closeAt.UTC().Format(time.RFC3339Nano))); code != 201 {
		t.Fatalf("create lottery: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "crash")
	users := lotteryUsers(entrants)
	var acked atomic.Int64
	done := make(chan map[string]string)
	go func() { done <- enterAll(t, c, "crash", users, 24, true, &acked) }()
	nodetest.WaitFor(t, entriesOpen, "a third of the entrants in", func() bool { return acked.Load() >= entrants/3 })
	leader := c.Leader()
	c.Crash(leader)
	t.Logf("crashed leader %s after %d entries", leader, acked.Load())
	nodetest.WaitFor(t, 15*time.Second, "a new leader", func() bool { return c.Leader() != "" })
	c.Start(leader, nil)
	ids := <-done
	if t.Failed() {
		t.FailNow()
	}
	if len(ids) != entrants {
		t.Fatalf("%d entrants acknowledged, want %d", len(ids), entrants)
	}
	nodetest.WaitReady(t, c)
	nodetest.WaitFor(t, time.Until(closeAt)+20*time.Second, "the draw on every node", func() bool {
		for _, id := range c.IDs {
			if code, _ := nodetest.CallQuiet(c.Client(id), "GET", "/v1/skus/crash/draw", ""); code != 200 {
				return false
			}
		}
		return true
	})
	d := recomputeDraw(t, c.Client(leader), "crash")
	if len(d.ranked) != entrants {
		t.Fatalf("the export holds %d entries, want %d (one each)", len(d.ranked), entrants)
	}
	for user, id := range ids {
		if d.seq[user] != id {
			t.Fatalf("%s was acknowledged entry %s; the export has %q", user, id, d.seq[user])
		}
	}
	checkDrawEverywhere(t, c, "crash", d.draw)
	orders := checkStandings(t, c, "crash", d, units, false)
	acks := map[string]bool{}
	for _, o := range orders {
		acks[o] = true
	}
	if a := checkClusterLedgers(t, c, "crash", acks); a["orders"] != float64(units) || a["held"] != float64(units) {
		t.Fatalf("ledger after the draw: %v", a)
	}
}
