package scenario

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/stock"
)

// boxCall is one call a box buyer made, as sent and answered.
type boxCall struct {
	buyer     int
	node      string
	op        string // deduct, confirm, cancel
	order     string // "" for a deduct
	call, ret int64
	code      int
	answer    string // error and detail, or the order id and state
}

// callBox makes one call of a box buyer and records it with its answer.
func (h *nemesisHistory) callBox(cl *fasthttp.HostClient, bc boxCall, method, path, body string) (int, map[string]any) {
	bc.call = h.now()
	code, out := nemesisCall(cl, method, path, body)
	bc.ret, bc.code = h.now(), code
	errCode, _ := out["error"].(string)
	detail, _ := out["detail"].(string)
	order, _ := out["order_id"].(string)
	state, _ := out["state"].(string)
	bc.answer = strings.TrimSpace(strings.Join([]string{errCode, detail, order, state}, " "))
	h.mu.Lock()
	h.boxCalls = append(h.boxCalls, bc)
	h.mu.Unlock()
	return code, out
}

// checkBoxOrders reads every box order a buyer won on every node: a
// confirmed one is sold, the rest released (cancelled or expired), once
// every hold has ended. A wrong one fails the test with its story.
func (h *nemesisHistory) checkBoxOrders(t *testing.T, c *nodetest.Cluster) {
	t.Helper()
	h.mu.Lock()
	fates := make(map[string]string, len(h.boxFate))
	for order, want := range h.boxFate {
		fates[order] = want
	}
	h.mu.Unlock()
	var wrong []string
	for order, want := range fates {
		for _, id := range c.IDs {
			code, o := nodetest.CallQuiet(c.Client(id), "GET", "/v1/orders/"+order, "")
			if code != 200 {
				t.Errorf("won box order %s on %s: %d %v", order, id, code, o)
				wrong = append(wrong, order)
				break
			}
			if want != "" && o["state"] != want {
				t.Errorf("box order %s on %s is %v, want %s: no confirm of it was answered ok, or one was", order, id, o["state"], want)
				wrong = append(wrong, order)
				break
			}
		}
	}
	for i, order := range wrong {
		if i == 3 {
			t.Logf("(and %d more wrong orders)", len(wrong)-i)
			break
		}
		t.Log(h.boxStory(c, order))
	}
	if len(wrong) > 0 {
		t.FailNow()
	}
}

// boxStory tells an order's whole life as the harness saw it and as each
// node holds it: every call its buyer made (the deducts that won it, each
// confirm and cancel, the 503s the history leaves out included) with the
// node that answered and its answer; then, node by node, the order's state
// and the feed's events for it, each with the log index it was applied at
// and the command's time, so that the call which took effect shows.
func (h *nemesisHistory) boxStory(c *nodetest.Cluster, order string) string {
	h.mu.Lock()
	buyer, known := h.boxBuyer[order]
	var calls []boxCall
	for _, bc := range h.boxCalls {
		if bc.order == order || (known && bc.op == "deduct" && bc.buyer == buyer) {
			calls = append(calls, bc)
		}
	}
	fate := h.boxFate[order]
	h.mu.Unlock()
	slices.SortFunc(calls, func(a, b boxCall) int { return cmp.Compare(a.call, b.call) })
	secs := func(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }
	var b strings.Builder
	fmt.Fprintf(&b, "the story of box order %s (buyer %d; the harness expects %q):", order, buyer, fate)
	for i := 0; i < len(calls); {
		// A run of calls answered alike (503s while no leader is known)
		// takes one line.
		bc, j := calls[i], i+1
		for j < len(calls) && calls[j].op == bc.op && calls[j].code == bc.code && calls[j].answer == bc.answer {
			j++
		}
		if j-i == 1 {
			fmt.Fprintf(&b, "\n  %s..%s %-7s on %s: %d %s", secs(bc.call), secs(bc.ret), bc.op, bc.node, bc.code, bc.answer)
		} else {
			var nodes []string
			for _, x := range calls[i:j] {
				if !slices.Contains(nodes, x.node) {
					nodes = append(nodes, x.node)
				}
			}
			fmt.Fprintf(&b, "\n  %s..%s %-7s %d calls on %s: %d %s", secs(bc.call), secs(calls[j-1].ret), bc.op, j-i, strings.Join(nodes, ","), bc.code, bc.answer)
		}
		i = j
	}
	for _, id := range c.IDs {
		n := c.Node(id)
		if n == nil {
			fmt.Fprintf(&b, "\n  %s: down", id)
			continue
		}
		code, o := nodetest.CallQuiet(c.Client(id), "GET", "/v1/orders/"+order, "")
		fmt.Fprintf(&b, "\n  %s (applied index %d): %d state=%v release_reason=%v expires_at=%v", id, n.Ledger().AppliedIndex(), code, o["state"], o["release_reason"], o["expires_at"])
		var after stock.Cursor
		for range 1000 { // pages: a schedule's feed holds a few thousand events
			page, err := n.Ledger().ReadFeed(after, 500)
			if err != nil {
				fmt.Fprintf(&b, "\n    feed: %v", err)
				break
			}
			for _, e := range page.Events {
				if e.Order.ID == order {
					fmt.Fprintf(&b, "\n    index %d at %s: %s state=%s %s", e.Index, secs(e.At-h.start.UnixNano()), e.Type, e.Order.State, e.Order.ReleaseReason)
				}
			}
			if len(page.Events) == 0 {
				break
			}
			after = page.Events[len(page.Events)-1].Cursor()
		}
	}
	fmt.Fprintf(&b, "\n  (times from the history's start; a hold lasts %s)", boxHoldTTL)
	return b.String()
}
