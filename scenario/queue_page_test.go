package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// The buyer's page (GET /q/{sku}) and the operator's page during a queued
// sale, in headless Chromium on three nodes.

// newTab opens a tab of browser at width×height on url.
func newTab(t *testing.T, browser context.Context, width, height int64, url string) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(tab, chromedp.EmulateViewport(width, height), chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	return tab
}

// pageState is the buyer's page's state (body's data-state).
func pageState(tab context.Context) string {
	s, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.dataset.state || ""`))
	if err != nil {
		return ""
	}
	return s
}

// waitState waits until the buyer's page in tab is in state want.
func waitState(t *testing.T, tab context.Context, who, want string, within time.Duration) {
	t.Helper()
	nodetest.WaitFor(t, within, who+"'s page to show "+want, func() bool { return pageState(tab) == want })
}

// buyButtonOn reports whether the buy button can be pressed.
func buyButtonOn(t *testing.T, tab context.Context) bool {
	t.Helper()
	off, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.getElementById("buy").disabled`))
	if err != nil {
		t.Fatal(err)
	}
	return !off
}

// screenshot saves tab's picture as name.png in dir ("": none asked for).
func screenshot(t *testing.T, tab context.Context, dir, name string) {
	t.Helper()
	if dir == "" {
		return
	}
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "queue-page-"+name+".png")
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s", out)
}

// TestQueuePage_ABuyerGoesThroughEveryState: a sale of one unit behind a
// waiting room (a bound of two tokens out, each lasting 2 s) on three
// nodes. Five buyers join through the API before the open and never buy.
// On phone-sized pages served by three different nodes: carol, who joined
// before the open, sees the countdown and a grey button; after the open
// alice joins at position 7 and sees her place, the people ahead and an
// ETA; as the admissions ahead of her run out she is admitted, the button
// turns on, and she buys through it; dave, who joined behind her, is told
// sold out at once. The operator's page follows the waiting room on a
// fourth tab. Every state is checked from the DOM against what the API
// says; the ledgers agree and hold alice's one order.
func TestQueuePage_ABuyerGoesThroughEveryState(t *testing.T) {
	browser := newBrowser(t)
	shots := os.Getenv("STOCKD_QUEUE_SCREENSHOTS")
	c := nodetest.StartCluster(t)
	ids := c.IDs
	url := func(i int, path string) string { return "http://" + c.Node(ids[i%len(ids)]).HTTPAddr() + path }
	start := time.Now().Add(15 * time.Second) // time for the setup below, on a busy machine
	sale := fmt.Sprintf(`{"total":1,"admission":"queue","queue_admit_ttl":"2s","start_at":%q}`, start.UTC().Format(time.RFC3339Nano))
	if code, body := nodetest.Call(t, c.Client(ids[0]), "PUT", "/v1/skus/drop", sale); code != 201 {
		t.Fatalf("create the sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "drop")
	for i := range 5 {
		if code, body := nodetest.Call(t, c.Client(ids[i%3]), "POST", "/v1/skus/drop/queue", fmt.Sprintf(`{"user":"api-%d"}`, i)); code != 200 {
			t.Fatalf("join api-%d: %d %v", i, code, body)
		}
	}
	ops := newTab(t, browser, 1280, 900, url(2, "/ui"))

	// Before the open: the countdown, the button grey.
	carol := newTab(t, browser, 390, 844, url(0, "/q/drop?user=carol"))
	waitState(t, carol, "carol", "before", 10*time.Second)
	if h, _ := pageText(carol, "#headline"); h != "The sale opens in" {
		t.Fatalf("carol's headline before the open: %q", h)
	}
	countdown, _ := pageText(carol, "#big")
	if m := regexp.MustCompile(`^0:(\d\d)$`).FindStringSubmatch(countdown); m == nil || m[1] > "15" {
		t.Fatalf("carol's countdown reads %q, want 0:ss within 15 s", countdown)
	}
	if buyButtonOn(t, carol) {
		t.Fatal("the buy button is on before the open")
	}
	if time.Now().After(start) {
		t.Fatal("the checks before the open ran past it: the test needs a later start_at")
	}
	screenshot(t, carol, shots, "before")
	waitText(t, ops, `#queues tr[data-sku="drop"] td.waiting`, "6")

	// The open: carol's page leaves the countdown by itself, at her place.
	nodetest.WaitFor(t, 20*time.Second, "carol's page to show the open", func() bool { return pageState(carol) != "before" })
	secret, err := chromedp.Run(carol, chromedp.Evaluate[string](`localStorage.getItem("stockd-ticket:drop:carol")`))
	if err != nil || secret == "" {
		t.Fatalf("carol's page keeps no ticket: %q %v", secret, err)
	}
	if code, tk := nodetest.Call(t, c.Client(ids[1]), "GET", "/v1/queue/"+secret, ""); code != 200 || tk["position"].(float64) < 1 || tk["position"].(float64) > 6 {
		t.Fatalf("carol's ticket after the open: %d %v", code, tk)
	}

	// In line: alice joins after the open, behind the six.
	alice := newTab(t, browser, 390, 844, url(1, "/q/drop?user=alice"))
	nodetest.WaitFor(t, 10*time.Second, "alice's page to show her place", func() bool {
		s, _ := pageText(alice, "#position")
		return pageState(alice) == "waiting" && s == "7"
	})
	ahead, _ := pageText(alice, "#ahead")
	if n, err := strconv.Atoi(ahead); err != nil || n < 0 || n > 6 {
		t.Fatalf("alice's page shows %q people ahead", ahead)
	}
	nodetest.WaitFor(t, 10*time.Second, "alice's page to show an ETA", func() bool {
		eta, _ := pageText(alice, "#eta")
		return strings.HasPrefix(eta, "about ") || eta == "any moment"
	})
	if buyButtonOn(t, alice) {
		t.Fatal("the buy button is on while alice waits")
	}
	screenshot(t, alice, shots, "waiting")
	checkOperatorQueue(t, ops)
	dave := newTab(t, browser, 390, 844, url(2, "/q/drop?user=dave"))
	nodetest.WaitFor(t, 10*time.Second, "dave's page to show his place", func() bool {
		s, _ := pageText(dave, "#position")
		return s == "8" || pageState(dave) == "admitted"
	})

	// Admitted: the button turns on; alice buys through it.
	waitState(t, alice, "alice", "admitted", 30*time.Second)
	if !buyButtonOn(t, alice) {
		t.Fatal("alice is admitted and the button is off")
	}
	if h, _ := pageText(alice, "#headline"); h != "It is your turn" {
		t.Fatalf("alice's headline once admitted: %q", h)
	}
	screenshot(t, alice, shots, "admitted")
	bought := time.Now()
	if err := chromedp.Do(alice, chromedp.Click("#buy")); err != nil {
		t.Fatal(err)
	}
	waitState(t, alice, "alice", "bought", 10*time.Second)
	detail, _ := pageText(alice, "#detail")
	order, ok := strings.CutPrefix(strings.TrimSuffix(detail, "."), "Order ")
	if !ok || order == "" {
		t.Fatalf("alice's page after the purchase: %q", detail)
	}
	screenshot(t, alice, shots, "bought")

	// Sold out: dave is told at once, by his long-poll.
	waitState(t, dave, "dave", "sold_out", 10*time.Second)
	t.Logf("dave's page said sold out %s after alice pressed buy", time.Since(bought).Round(time.Millisecond))
	if h, _ := pageText(dave, "#headline"); h != "Sold out" || buyButtonOn(t, dave) {
		t.Fatalf("dave's page: %q, button on %v", h, buyButtonOn(t, dave))
	}
	screenshot(t, dave, shots, "sold_out")
	nodetest.WaitFor(t, 10*time.Second, "carol's page to end", func() bool { s := pageState(carol); return s == "expired" || s == "sold_out" })

	// The operator's page: one bought, everyone else told, how fast.
	code, qv := nodetest.Call(t, c.Client(ids[2]), "GET", "/v1/skus/drop/queue", "")
	if code != 200 || qv["bought"].(float64) != 1 {
		t.Fatalf("the queue after the sale: %d %v", code, qv)
	}
	waitText(t, ops, `#queues tr[data-sku="drop"] td.bought`, "1")
	waitText(t, ops, `#queues tr[data-sku="drop"] td.sold-out-told`, fmt.Sprint(qv["sold_out_told"]))
	waitText(t, ops, `#queues tr[data-sku="drop"] td.admitted`, "0 / 0")
	told, _ := pageText(ops, `#queues tr[data-sku="drop"] td.told-in`)
	if d, err := time.ParseDuration(told); err != nil || d > 5*time.Second {
		t.Fatalf("the operator's page says everyone was told in %q", told)
	}
	t.Logf("the operator's page: told everyone in %s", told)
	screenshot(t, ops, shots, "operator")

	// Told once, true after: dave's admission running out since (2 s)
	// does not turn his sold_out into expired.
	daveSecret, _ := chromedp.Run(dave, chromedp.Evaluate[string](`localStorage.getItem("stockd-ticket:drop:dave")`))
	time.Sleep(time.Until(bought.Add(3 * time.Second))) // time passing is what is tested here, not a wait for an event
	if code, tk := nodetest.Call(t, c.Client(ids[0]), "GET", "/v1/queue/"+daveSecret, ""); code != 200 || tk["state"] != "sold_out" {
		t.Fatalf("dave's ticket 3 s on: %d %v", code, tk)
	}
	if _, again := nodetest.Call(t, c.Client(ids[2]), "GET", "/v1/skus/drop/queue", ""); again["expired"] != qv["expired"] || again["sold_out_told"] != qv["sold_out_told"] {
		t.Fatalf("the waiting room moved after the sell-out: %v, then %v", qv, again)
	}
	checkClusterLedgers(t, c, "drop", map[string]bool{order: true})
}

// checkOperatorQueue checks the operator's page's row of sale drop while
// its line moves: tokens out within the bound of 2, a measured rate.
func checkOperatorQueue(t *testing.T, ops context.Context) {
	t.Helper()
	nodetest.WaitFor(t, 10*time.Second, "the operator's page to show the waiting room moving", func() bool {
		out, _ := pageText(ops, `#queues tr[data-sku="drop"] td.admitted`)
		rate, _ := pageText(ops, `#queues tr[data-sku="drop"] td.admit-rate`)
		total, _ := pageText(ops, `#queues tr[data-sku="drop"] td.admitted-total`)
		n, _ := strconv.Atoi(total)
		return regexp.MustCompile(`^[0-2] / 2$`).MatchString(out) && rate != "0.0/s" && strings.HasSuffix(rate, "/s") && n >= 2
	})
	if bad, _ := chromedp.Run(ops, chromedp.Evaluate[int](`document.querySelectorAll("#queues td.bad").length`)); bad != 0 {
		t.Fatalf("the operator's page marks tokens out past the bound")
	}
}

// TestQueuePage_ServedByBothDoors: GET /q/{sku} answers the page through
// the event loop and fasthttp alike, with the header that keeps it from
// loading or calling anything but its node; a name that is no SKU is a
// 404, another method a 405.
func TestQueuePage_ServedByBothDoors(t *testing.T) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) {
			n := nodetest.StartNodeWith(t, t.TempDir(), func(c *node.Config) { c.DeductLoop = loop })
			cl := nodetest.ClientOf(n, 1)
			for _, c := range []struct {
				method, path string
				code         int
				has          string
			}{
				{"GET", "/q/phone?user=alice", 200, `<meta name="stockd-base" content="">`},
				{"GET", "/q/" + strings.Repeat("x", 129), 404, "bad_request"},
				{"GET", "/q/", 404, "bad_request"},
				{"POST", "/q/phone", 405, "method_not_allowed"},
			} {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI(nodetest.URL(cl, c.path))
				req.Header.SetMethod(c.method)
				if err := cl.DoTimeout(req, resp, 10*time.Second); err != nil {
					t.Fatal(err)
				}
				body, csp := string(resp.Body()), string(resp.Header.Peek("Content-Security-Policy"))
				if resp.StatusCode() != c.code || !strings.Contains(body, c.has) {
					t.Errorf("%s %s: %d %.200q, want %d with %q", c.method, c.path, resp.StatusCode(), body, c.code, c.has)
				}
				if c.code == 200 && !strings.Contains(csp, "default-src 'self'") {
					t.Errorf("%s %s: Content-Security-Policy %q", c.method, c.path, csp)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		})
	}
}
