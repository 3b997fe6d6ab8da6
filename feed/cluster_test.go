package feed_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/feed"
	"stockd.dev/stockd/node/nodetest"
)

// TestFeed_ThroughAFollowerOfARealCluster: the consumer reads a three-node
// cluster's feed through a follower. It prints each sale's event once,
// in the feed's order, and its acknowledgement reaches every node.
func TestFeed_ThroughAFollowerOfARealCluster(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader, follower := c.Leader(), c.Follower()
	if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/cap", `{"total":20}`); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "cap")
	orders := map[string]bool{}
	for b := range 12 {
		code, body := nodetest.Call(t, c.Client(c.NodeIDs()[b%3]), "POST", "/v1/skus/cap/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, b, b))
		if code != 200 {
			t.Fatalf("deduct %d: %d %v", b, code, body)
		}
		orders[body["order_id"].(string)] = true
	}
	var out, errs bytes.Buffer
	args := []string{"-target", "http://" + c.Node(follower).HTTPAddr(), "-consumer", "ship", "-limit", "5", "-wait", "2s", "-max-events", "12"}
	if err := feed.Main(context.Background(), args, &out, &errs); err != nil {
		t.Fatalf("feed: %v: %s", err, errs.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 12 {
		t.Fatalf("printed %d events, want 12:\n%s", len(lines), out.String())
	}
	last := ""
	for _, line := range lines {
		var e struct {
			Cursor  string `json:"cursor"`
			Type    string `json:"type"`
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Type != "order_created" || !orders[e.OrderID] {
			t.Fatalf("event %q: %v", line, err)
		}
		delete(orders, e.OrderID)
		last = e.Cursor
	}
	for _, id := range c.NodeIDs() {
		nodetest.WaitFor(t, 10*time.Second, "the acknowledgement on "+id, func() bool {
			_, st := nodetest.CallQuiet(c.Client(id), "GET", "/v1/consumers", "")
			cs, _ := st["consumers"].([]any)
			return len(cs) == 1 && cs[0].(map[string]any)["cursor"] == last
		})
		nodetest.CheckLedger(t, c.Client(id), "cap")
	}
}
