package scenario

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// admittedToken creates queued sale sku (ttl: its queue_admit_ttl),
// joins user before its open and follows the ticket until admitted:
// the ticket's secret and token.
func admittedToken(t *testing.T, addr string, sku, user, ttl string) (secret, token string) {
	t.Helper()
	start := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
	if code, out := rawCall(t, addr, rawPut("/v1/skus/"+sku, fmt.Sprintf(`{"total":5,"admission":"queue","queue_admit_ttl":%q,"start_at":%q}`, ttl, start))); code != 201 {
		t.Fatalf("create %s: %d %v", sku, code, out)
	}
	code, tk := rawCall(t, addr, rawPost("/v1/skus/"+sku+"/queue", fmt.Sprintf(`{"user":%q}`, user)))
	if code != 200 {
		t.Fatalf("%s joins %s: %d %v", user, sku, code, tk)
	}
	secret = tk["ticket"].(string)
	deadline := time.Now().Add(15 * time.Second)
	for tk["state"] != "admitted" {
		if time.Now().After(deadline) {
			t.Fatalf("%s's ticket of %s never admitted: %v", user, sku, tk)
		}
		_, tk = rawCall(t, addr, rawGet("/v1/queue/"+secret+"?wait=5s"))
	}
	return secret, tk["admission_token"].(string)
}

func rawGet(path string) string {
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: stockd\r\n\r\n", path)
}

func rawPut(path, body string) string {
	return strings.Replace(rawPost(path, body), "POST ", "PUT ", 1)
}

// TestQueue_RefusalsChangeNothing sends a queued sale's deducts that must
// be refused through both HTTP doors (the event loop and fasthttp) and as
// batch items: no token (admission_required); a forged one, one altered
// by a byte, another user's, another sale's, an expired one, a spent one
// and one whose key rotated out (admission_invalid); header and body
// tokens that differ (400). The ledger and the order feed stay as they
// were; the token itself buys once.
func TestQueue_RefusalsChangeNothing(t *testing.T) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) {
			n := nodetest.StartNodeWith(t, t.TempDir(), func(c *node.Config) { c.DeductLoop = loop })
			cl := nodetest.ClientOf(n, 1)
			addr := n.HTTPAddr()
			_, alice := admittedToken(t, addr, "q", "alice", "1m")
			// bob waits behind alice in q: a second ticket of the sale.
			if code, out := rawCall(t, addr, rawPost("/v1/skus/q/queue", `{"user":"bob"}`)); code != 200 {
				t.Fatalf("bob joins: %d %v", code, out)
			}
			_, otherSale := admittedToken(t, addr, "q2", "alice", "1m")
			expiredSecret, expired := admittedToken(t, addr, "q3", "alice", "1s")
			nodetest.WaitFor(t, 10*time.Second, "alice's q3 admission to expire", func() bool {
				_, tk := rawCall(t, addr, rawGet("/v1/queue/"+expiredSecret))
				return tk["state"] == "expired"
			})
			_, rotated := admittedToken(t, addr, "q4", "alice", "1m")
			for range 2 {
				if code, out := rawCall(t, addr, rawPost("/v1/skus/q4/queue/rotate", "")); code != 200 {
					t.Fatalf("rotate: %d %v", code, out)
				}
			}
			altered := []byte(alice)
			altered[50] = map[bool]byte{true: 'B', false: 'A'}[altered[50] == 'A']
			forged := "AQAAAAEAAAAAAAAAAQ" + strings.Repeat("A", 85)

			// The spent token: alice buys once with it.
			code, won := rawCall(t, addr, rawPost("/v1/skus/q/deduct", `{"user":"alice","request_id":"buy-1","admission_token":"`+alice+`"}`))
			if code != 200 {
				t.Fatalf("alice's purchase with her token: %d %v", code, won)
			}
			before := map[string]map[string]any{}
			for _, sku := range []string{"q", "q2", "q3", "q4"} {
				before[sku] = nodetest.CheckLedger(t, cl, sku)
			}
			_, feedBefore := nodetest.Call(t, cl, "GET", "/v1/events?limit=1000", "")
			for _, c := range []struct {
				name, sku, user, token, want string
			}{
				{"no token", "q", "bob", "", "admission_required"},
				{"forged", "q", "bob", forged, "admission_invalid"},
				{"altered by a byte", "q", "alice", string(altered), "admission_invalid"},
				{"another user's", "q", "bob", alice, "admission_invalid"},
				{"another sale's", "q", "alice", otherSale, "admission_invalid"},
				{"spent", "q", "alice", alice, "admission_invalid"},
				{"expired", "q3", "alice", expired, "admission_invalid"},
				{"key rotated out", "q4", "alice", rotated, "admission_invalid"},
			} {
				body := fmt.Sprintf(`{"user":%q,"request_id":"r-%s"`, c.user, strings.ReplaceAll(c.name, " ", "-"))
				var headers []string
				if c.token != "" {
					if strings.Contains(c.name, "a") && len(c.name)%2 == 0 {
						headers = []string{"Stockd-Admission: " + c.token} // half in the header
					} else {
						body += `,"admission_token":"` + c.token + `"`
					}
				}
				code, out := rawCall(t, addr, rawPost("/v1/skus/"+c.sku+"/deduct", body+"}", headers...))
				if code != 403 || out["error"] != c.want {
					t.Errorf("%s: %d %v, want 403 %s", c.name, code, out, c.want)
				}
				item := fmt.Sprintf(`{"sku":%q,"user":%q,"request_id":"b-%s"`, c.sku, c.user, strings.ReplaceAll(c.name, " ", "-"))
				if c.token != "" {
					item += `,"admission_token":"` + c.token + `"`
				}
				code, out = rawCall(t, addr, rawPost("/v1/deducts", `{"deducts":[`+item+`}]}`))
				results, _ := out["results"].([]any)
				if code != 200 || len(results) != 1 || results[0].(map[string]any)["status"] != 403.0 || results[0].(map[string]any)["error"] != c.want {
					t.Errorf("%s as a batch item: %d %v, want 403 %s", c.name, code, out, c.want)
				}
			}
			code, out := rawCall(t, addr, rawPost("/v1/skus/q/deduct", `{"user":"bob","admission_token":"`+alice+`"}`, "Stockd-Admission: "+forged))
			if code != 400 || !strings.Contains(out["detail"].(string), "differ") {
				t.Errorf("header and body tokens that differ: %d %v", code, out)
			}
			// Leases and the queues' ticks go on; the sales' orders and units
			// do not move.
			for sku, b := range before {
				after := nodetest.CheckLedger(t, cl, sku)
				for _, k := range []string{"total", "held", "sold", "orders"} {
					if b[k] != after[k] {
						t.Errorf("refusals changed %s's %s: %v, then %v", sku, k, b[k], after[k])
					}
				}
			}
			if _, feedAfter := nodetest.Call(t, cl, "GET", "/v1/events?limit=1000", ""); fmt.Sprint(feedBefore["events"]) != fmt.Sprint(feedAfter["events"]) {
				t.Errorf("refusals changed the order feed")
			}
			if before["q"]["sold"] != 1.0 {
				t.Errorf("q sold %v, want alice's one unit", before["q"]["sold"])
			}
		})
	}
}
