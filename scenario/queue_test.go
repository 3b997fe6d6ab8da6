package scenario

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm/waitroom"
)

type queueTicket struct {
	secret, id, state string
	position          int64
}

func ticketOf(m map[string]any) queueTicket {
	t := queueTicket{}
	t.secret, _ = m["ticket"].(string)
	t.id, _ = m["ticket_id"].(string)
	t.state, _ = m["state"].(string)
	if p, ok := m["position"].(float64); ok {
		t.position = int64(p)
	}
	return t
}

// TestQueue_SellsInLineOrderToAdmittedBuyersAndTellsEveryoneAtOnce: a
// sale of 30 units behind a waiting room on three nodes. 150 users join
// before the open, each twice at once on two nodes: one ticket each. At
// the open the positions are 1..150 in the order recomputed from the
// revealed seed and the tickets stream. Buyers follow their tickets with
// long-polls and deduct with their token once admitted (one position in
// ten never does: their admissions expire and the next positions come in);
// tokens out never pass the bound. Refusals change nothing: no token, a
// forged one, another user's, a spent one. Every unit sells, no user
// buys twice, the law holds on every node, and every ticket that did not
// buy reads sold_out.
func TestQueue_SellsInLineOrderToAdmittedBuyersAndTellsEveryoneAtOnce(t *testing.T) {
	c := nodetest.StartCluster(t)
	nodetest.WaitRulesCurrent(t, c)
	const units, users = 30, 150
	// Every user waits on a ticket at once: pools bigger than the
	// cluster's own.
	pools := map[string]*fasthttp.HostClient{}
	for _, id := range c.IDs {
		pools[id] = &fasthttp.HostClient{Addr: c.Client(id).Addr, MaxConns: 4 * users, MaxConnWaitTimeout: 10 * time.Second,
			ReadTimeout: 20 * time.Second, WriteTimeout: 5 * time.Second}
	}
	client := func(i int) *fasthttp.HostClient { return pools[c.IDs[i%3]] }
	start := time.Now().Add(3 * time.Second).UTC()
	body := fmt.Sprintf(`{"total":%d,"admission":"queue","queue_overadmit":1,"queue_admit_ttl":"1s","start_at":%q}`, units, start.Format(time.RFC3339Nano))
	code, sale := nodetest.Call(t, c.Client(c.Leader()), "PUT", "/v1/skus/q1", body)
	if code != 201 || sale["admission"] != "queue" || sale["queue"] == nil {
		t.Fatalf("create: %d %v", code, sale)
	}
	commitment := sale["queue"].(map[string]any)["seed_commitment"].(string)
	nodetest.WaitSaleEverywhere(t, c, "q1")
	if code, b := nodetest.Call(t, c.Client(c.IDs[1]), "POST", "/v1/skus/q1/deduct", `{"user":"x"}`); code != 425 {
		t.Fatalf("a deduct before the open: %d %v", code, b)
	}

	// Every user joins twice at once, on two nodes.
	tickets := make([]queueTicket, users)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range users {
		for k := range 2 {
			wg.Go(func() {
				code, b := nodetest.CallQuiet(client(i+k), "POST", "/v1/skus/q1/queue", fmt.Sprintf(`{"user":"u%d"}`, i))
				if code != 200 {
					t.Errorf("join of u%d on %s: %d %v", i, c.IDs[(i+k)%3], code, b)
					return
				}
				tk := ticketOf(b)
				mu.Lock()
				defer mu.Unlock()
				if tickets[i].secret != "" && tickets[i].secret != tk.secret {
					t.Errorf("u%d holds two tickets: %s and %s", i, tickets[i].id, tk.id)
				}
				tickets[i] = tk
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if tickets[0].state != "waiting" || tickets[0].position != 0 {
		t.Fatalf("before the open a ticket reads %+v", tickets[0])
	}

	// The open: the seed revealed, positions from it.
	var view map[string]any
	nodetest.WaitFor(t, 15*time.Second, "the open", func() bool {
		_, view = nodetest.Call(t, c.Client(c.IDs[1]), "GET", "/v1/skus/q1/queue", "") // the node the tickets stream comes from
		return view["seed"] != ""
	})
	seed, _ := hex.DecodeString(view["seed"].(string))
	if sum := sha256Hex(seed); sum != commitment {
		t.Fatalf("the seed %x hashes to %s, the commitment was %s", seed, sum, commitment)
	}
	ticketsInLineOrder(t, c.Client(c.IDs[1]), "q1", seed, users)

	// Buyers: follow the ticket, deduct once admitted (one in ten never).
	var bought, refusedAfterWin, told, expired, lastWinner atomic.Int64
	var maxOut atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, v := nodetest.CallQuiet(c.Client(c.Leader()), "GET", "/v1/skus/q1/queue", "")
			if v == nil {
				continue
			}
			checkQueueBound(t, v, units)
			maxOut.Store(max(maxOut.Load(), int64(v["admitted_outstanding"].(float64))))
		}
	}()
	winners := map[string]string{}
	for i := range users {
		wg.Go(func() {
			node := client(i)
			secret := tickets[i].secret
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				code, b := nodetest.CallQuiet(node, "GET", "/v1/queue/"+secret+"?wait=5s", "")
				if code != 200 {
					t.Errorf("u%d's ticket: %d %v", i, code, b)
					return
				}
				switch b["state"] {
				case "sold_out":
					told.Add(1)
					return
				case "expired":
					expired.Add(1)
					return
				case "bought":
					t.Errorf("u%d's ticket reads bought before its deduct answered", i)
					return
				case "admitted":
					if int64(b["position"].(float64))%10 == 3 {
						continue // this one never buys (three of the first 30): the admission runs out
					}
					token := b["admission_token"].(string)
					other := client(rand.IntN(3))
					var code int
					var d map[string]any
					if i%2 == 0 {
						code, d = nodetest.CallHeader(other, "POST", "/v1/skus/q1/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"q-%d"}`, i, i), "Stockd-Admission", token)
					} else {
						code, d = nodetest.CallHeader(other, "POST", "/v1/skus/q1/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"q-%d","admission_token":%q}`, i, i, token), "", "")
					}
					switch {
					case code == 200:
						bought.Add(1)
						for p := int64(b["position"].(float64)); p > lastWinner.Load(); {
							if lastWinner.CompareAndSwap(lastWinner.Load(), p) {
								break
							}
						}
						mu.Lock()
						winners[fmt.Sprintf("u%d", i)] = d["order_id"].(string)
						mu.Unlock()
						// The token is spent: a new purchase with it is refused.
						// (A sold_out answer comes first once the last unit sold.)
						if code, b := nodetest.CallHeader(node, "POST", "/v1/skus/q1/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"again-%d"}`, i, i), "Stockd-Admission", token); code != 403 && b["error"] != "sold_out" {
							t.Errorf("u%d's spent token: %d %v", i, code, b)
							refusedAfterWin.Add(1)
						}
						// Another user's token is refused.
						if code, b := nodetest.CallHeader(node, "POST", "/v1/skus/q1/deduct", `{"user":"mallory"}`, "Stockd-Admission", token); code != 403 && b["error"] != "sold_out" {
							t.Errorf("u%d's token for mallory: %d %v", i, code, b)
							refusedAfterWin.Add(1)
						}
						return
					case code == 409 && d["error"] == "sold_out":
						continue // held units may still come back: follow the ticket
					default:
						t.Errorf("u%d's deduct with its token: %d %v", i, code, d)
						return
					}
				}
			}
			t.Errorf("u%d's ticket never settled", i)
		})
	}
	// Refusals while the sale runs.
	for _, r := range []struct {
		name, body, header string
		want               string
	}{
		{"no token", `{"user":"u3"}`, "", "admission_required"},
		{"forged", `{"user":"u3"}`, "AQAAAAEAAAAAAAAAAQ" + string(bytes.Repeat([]byte("A"), 85)), "admission_invalid"},
	} {
		name := ""
		if r.header != "" {
			name = "Stockd-Admission"
		}
		code, b := nodetest.CallHeader(c.Client(c.IDs[0]), "POST", "/v1/skus/q1/deduct", r.body, name, r.header)
		if code != 403 || b["error"] != r.want {
			t.Errorf("%s: %d %v, want 403 %s", r.name, code, b, r.want)
		}
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	if refusedAfterWin.Load() != 0 {
		t.Fatalf("%d spent or borrowed tokens were taken", refusedAfterWin.Load())
	}
	if bought.Load() != units || len(winners) != units {
		t.Fatalf("%d bought, %d distinct winners, for %d units", bought.Load(), len(winners), units)
	}
	// With queue_overadmit 1 the first 30 positions hold every unit; the
	// ones among them that never buy let later positions in as their
	// admissions expire.
	if told.Load()+expired.Load()+bought.Load() != users || expired.Load() == 0 || lastWinner.Load() <= units {
		t.Fatalf("%d bought (the last at position %d), %d told sold_out, %d expired, of %d tickets", bought.Load(), lastWinner.Load(), told.Load(), expired.Load(), users)
	}
	audit := checkClusterLedgers(t, c, "q1", nil)
	if audit["sold"] != float64(units) {
		t.Fatalf("sold %v", audit["sold"])
	}
	_, v := nodetest.Call(t, c.Client(c.IDs[1]), "GET", "/v1/skus/q1/queue", "")
	checkQueueBound(t, v, units)
	metricsText := nodetest.GetRaw(t, c.Client(c.IDs[0]), "/metrics")
	for _, want := range []string{`stockd_queue_tickets{sku="q1",state="bought"} 30`, `stockd_queue_tokens_refused_total{reason="missing"} 1`,
		`stockd_queue_admitted_outstanding{sku="q1"} 0`, `stockd_queue_tokens_refused_total{reason="malformed"} 0`} {
		if !strings.Contains(metricsText, want+"\n") {
			t.Errorf("n1's metrics lack %s", want)
		}
	}
	// The forged token, and tokens lent to mallory, some on n1.
	if strings.Contains(metricsText, `stockd_queue_tokens_refused_total{reason="forged"} 0`+"\n") {
		t.Errorf("n1 counts no forged token")
	}
	t.Logf("bought %d (the last at position %d), told sold_out %d, expired %d, most tokens out at once %d; queue %v", bought.Load(), lastWinner.Load(), told.Load(), expired.Load(), maxOut.Load(), v)
}

// checkQueueBound checks a queue view of a sale of units without holds
// and a queue_overadmit of 1: a token is issued only while those out are
// fewer than the units remaining, so the tokens issued less those that
// ran out (the bought and the still out) never pass the units, and none
// is out past the bound but those issued before buys lowered it.
func checkQueueBound(t *testing.T, v map[string]any, units int64) {
	t.Helper()
	total, expired := int64(v["admitted_total"].(float64)), int64(v["expired"].(float64))
	if total-expired > units {
		t.Errorf("%d tokens issued, %d ran out: %d bought or out for %d units", total, expired, total-expired, units)
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// lineTicket is one line of a sale's tickets stream.
type lineTicket struct {
	TicketID    string `json:"ticket_id"`
	Position    int64  `json:"position"`
	JoinedIndex int64  `json:"joined_index"`
}

// ticketsInLineOrder reads sale sku's tickets stream from cl and checks
// it holds n tickets at positions 1..n in the order of
// SHA-256(seed || hex(ticket id)), join order on a tie.
func ticketsInLineOrder(t *testing.T, cl *fasthttp.HostClient, sku string, seed []byte, n int) []lineTicket {
	t.Helper()
	raw := nodetest.GetRaw(t, cl, "/v1/skus/"+sku+"/queue/tickets")
	var lines []lineTicket
	sc := bufio.NewScanner(bytes.NewReader([]byte(raw)))
	for sc.Scan() {
		var l struct {
			lineTicket
			Done bool `json:"done"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("tickets line %q: %v", sc.Text(), err)
		}
		if !l.Done {
			lines = append(lines, l.lineTicket)
		}
	}
	if len(lines) != n {
		t.Fatalf("the tickets stream of %s has %d lines, want %d", sku, len(lines), n)
	}
	want := slices.Clone(lines)
	slices.SortFunc(want, func(x, y lineTicket) int {
		var ix, iy [32]byte
		hex.Decode(ix[:], []byte(x.TicketID))
		hex.Decode(iy[:], []byte(y.TicketID))
		kx, ky := waitroom.OrderKey(seed, ix), waitroom.OrderKey(seed, iy)
		return cmp.Or(bytes.Compare(kx[:], ky[:]), cmp.Compare(x.JoinedIndex, y.JoinedIndex))
	})
	for i, l := range lines {
		if l.Position != int64(i)+1 || want[i].TicketID != l.TicketID {
			t.Fatalf("line %d: ticket %s at position %d; recomputed from the seed: %s", i, l.TicketID, l.Position, want[i].TicketID)
		}
	}
	return lines
}

// TestQueue_HoldsThatExpireUnpaidAdmitTheNext: a queued sale of 20 units
// with holds on three in-process nodes (the multi-process queue test runs
// the same at ten times the size).
func TestQueue_HoldsThatExpireUnpaidAdmitTheNext(t *testing.T) {
	c := nodetest.StartCluster(t)
	nodetest.WaitRulesCurrent(t, c)
	holdsExpireAdmitTheNext(t, c, func(i int) *fasthttp.HostClient { return c.Client(c.IDs[i%3]) }, "qh", 20, 60)
}

// holdsExpireAdmitTheNext runs a queued sale of units with holds
// (queue_overadmit 1) for users joined before its open. The buyers at
// every fourth position hold a unit and never pay: when their holds
// expire the units come back and admit the next positions, which win
// them. At the end every unit is sold (paid), no unit is held, and the
// law holds on every node.
func holdsExpireAdmitTheNext(t *testing.T, sc nodetest.SalesCluster, node func(i int) *fasthttp.HostClient, sku string, units, users int) {
	t.Helper()
	start := time.Now().Add(2*time.Second + time.Duration(users)*10*time.Millisecond).UTC()
	body := fmt.Sprintf(`{"total":%d,"admission":"queue","queue_overadmit":1,"queue_admit_ttl":"30s","hold_ttl":"1s","start_at":%q}`, units, start.Format(time.RFC3339Nano))
	if code, out := nodetest.Call(t, node(0), "PUT", "/v1/skus/"+sku, body); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, sc, sku)
	secrets := make([]string, users)
	var joins sync.WaitGroup
	for w := range 16 {
		joins.Go(func() {
			for i := w; i < users; i += 16 {
				code, b := nodetest.Call(t, node(i), "POST", "/v1/skus/"+sku+"/queue", fmt.Sprintf(`{"user":"u%d"}`, i))
				if code != 200 {
					t.Errorf("join u%d: %d %v", i, code, b)
					return
				}
				secrets[i] = b["ticket"].(string)
			}
		})
	}
	joins.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if time.Now().After(start) {
		t.Fatalf("the joins ran past the open")
	}
	var paid, unpaid atomic.Int64
	var lastPaidPos atomic.Int64
	var wg sync.WaitGroup
	for i := range users {
		wg.Go(func() {
			cl := node(i)
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				code, b := nodetest.CallQuiet(cl, "GET", "/v1/queue/"+secrets[i]+"?wait=5s", "")
				if code != 200 {
					time.Sleep(50 * time.Millisecond) // a retry's pause
					continue
				}
				switch b["state"] {
				case "sold_out", "expired", "bought":
					return
				case "waiting":
					continue
				}
				pos := int64(b["position"].(float64))
				code, d := nodetest.CallHeader(cl, "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"h-%d"}`, i, i), "Stockd-Admission", b["admission_token"].(string))
				switch {
				case code == 200 && d["state"] == "held" && pos%4 == 0:
					unpaid.Add(1) // never pays: the hold expires and the unit comes back
					return
				case code == 200 && d["state"] == "held":
					if code, o := nodetest.Call(t, cl, "POST", "/v1/orders/"+d["order_id"].(string)+"/confirm", ""); code != 200 || o["state"] != "sold" {
						t.Errorf("u%d's confirm: %d %v", i, code, o)
						return
					}
					paid.Add(1)
					for p := lastPaidPos.Load(); pos > p && !lastPaidPos.CompareAndSwap(p, pos); p = lastPaidPos.Load() {
					}
					return
				case code == 409 && d["error"] == "sold_out":
					continue // units held by others may come back
				default:
					t.Errorf("u%d's deduct: %d %v", i, code, d)
					return
				}
			}
			t.Errorf("u%d's ticket never settled", i)
		})
	}
	wg.Wait()
	if paid.Load() != int64(units) || unpaid.Load() == 0 || lastPaidPos.Load() <= int64(units) {
		t.Fatalf("%d paid (the last at position %d), %d holds left unpaid, for %d units", paid.Load(), lastPaidPos.Load(), unpaid.Load(), units)
	}
	audit := checkClusterLedgers(t, sc, sku, nil)
	if audit["sold"] != float64(units) || audit["held"] != 0.0 {
		t.Fatalf("audit %v", audit)
	}
	_, v := nodetest.Call(t, node(2), "GET", "/v1/skus/"+sku+"/queue", "")
	t.Logf("%d paid (the last at position %d), %d unpaid holds let later positions in; queue %v", paid.Load(), lastPaidPos.Load(), unpaid.Load(), v)
}
