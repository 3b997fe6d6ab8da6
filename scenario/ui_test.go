package scenario

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The operator's page in a real browser: headless Chromium through
// chromedp. CI installs Chromium (.ci/run); elsewhere the tests say why
// they skip when none can be started.

// browserPath finds a Chromium or Chrome binary.
func browserPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts headless Chromium for one test, or skips it (outside
// CI) when there is none.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := browserPath()
	if path == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no Chromium in CI: .ci/run installs the chromium package")
		}
		t.Skip("no Chromium or Chrome found (apt-get install chromium): the operator page's browser tests need one")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	// The first action starts the browser; its context must have no
	// deadline (the browser lives as long as it).
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("start %s: %v", path, err)
		}
		t.Skipf("cannot start %s: %v", path, err)
	}
	return ctx
}

// pageText reads the text of the first element matching sel, as a person
// sees it, or "" while there is none.
func pageText(ctx context.Context, sel string) (string, error) {
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, sel)))
	return strings.TrimSpace(s), err
}

// waitText waits, with a deadline, until the text at sel is want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	var got string
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		got, err = pageText(ctx, sel)
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s shows %q, want %q", sel, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestUI_PageFollowsASaleLive(t *testing.T) {
	ctx := newBrowser(t)
	c := nodetest.StartCluster(t)
	follower := ""
	for _, id := range c.IDs {
		if id != c.Leader() {
			follower = id
			break
		}
	}
	if code, body := nodetest.Call(t, c.Client(follower), "PUT", "/v1/skus/tv", `{"total":50}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "tv")
	if code, body := nodetest.Call(t, c.Client(follower), "PUT", "/v1/consumers/shop", `{"cursor":"0"}`); code != 200 {
		t.Fatalf("register consumer: %d %v", code, body)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+c.Node(follower).HTTPAddr()+"/ui"), chromedp.WaitVisible(`#skus`)); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, `#skus tr[data-sku="tv"] td.remaining`, "50")
	// Before any deduct the rate chart says why it is empty, and the
	// table says what its columns hold.
	nodetest.WaitFor(t, 20*time.Second, "the empty rate chart to say why", func() bool {
		s, err := pageText(ctx, "#rates-empty")
		return err == nil && strings.HasPrefix(s, "no deducts answered by this node")
	})
	if help, err := pageText(ctx, "#skus-help"); err != nil || !strings.Contains(help, "in this node's buckets") {
		t.Fatalf("the sales table's help reads %q (%v)", help, err)
	}
	origin := func() float64 {
		t.Helper()
		o, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`performance.timeOrigin`))
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	loaded := origin()

	// A sale while the page is open: it follows without a reload.
	wave := buyWave(c, "tv", 0, 20, 4, nil)
	acked := ackedOrders(t, wave)
	if len(acked) != 20 {
		t.Fatalf("%d of 20 buyers won", len(acked))
	}
	waitText(t, ctx, `#skus tr[data-sku="tv"] td.remaining`, "30")
	waitText(t, ctx, `#skus tr[data-sku="tv"] td.sold`, "20")
	waitText(t, ctx, `#leader`, c.Leader())
	waitText(t, ctx, `#node-id`, follower)
	for _, id := range c.IDs {
		sel := fmt.Sprintf(`#nodes tr[data-node=%q] td.state`, id)
		want := "Follower"
		if id == c.Leader() {
			want = "Leader"
		}
		waitText(t, ctx, sel, want)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#nodes tbody tr").length`))
	if err != nil || rows != len(c.IDs) {
		t.Fatalf("the node list has %d rows, want %d (%v)", rows, len(c.IDs), err)
	}
	waitText(t, ctx, `#consumers tr[data-consumer="shop"] td:nth-child(3)`, "20")
	waitText(t, ctx, `#skus tr[data-sku="tv"] td.audit`, "clean")

	// A lottery shows its phase and its entries.
	closeAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if code, body := nodetest.Call(t, c.Client(follower), "PUT", "/v1/skus/raffle", `{"total":2,"mode":"lottery","entries_close_at":"`+closeAt+`"}`); code != 201 {
		t.Fatalf("create lottery: %d %v", code, body)
	}
	for _, u := range []string{"ann", "bob", "cy"} {
		if code, body := nodetest.Call(t, c.Client(follower), "POST", "/v1/skus/raffle/enter", `{"user":"`+u+`"}`); code != 202 {
			t.Fatalf("enter %s: %d %v", u, code, body)
		}
	}
	waitText(t, ctx, `#skus tr[data-sku="raffle"] td.state`, "lottery entering, 3 entries")

	// No reload: the document that showed 50 is the one showing 30.
	if now := origin(); now != loaded {
		t.Fatalf("the page was loaded again (%v, then %v)", loaded, now)
	}
	checkClusterLedgers(t, c, "tv", acked)

	// A screenshot for docs/operations.md, when asked for (make ui-screenshot):
	// in the middle of a larger sale, buyers on every node.
	if out := os.Getenv("STOCKD_UI_SCREENSHOT"); out != "" {
		screenshotMidSale(t, ctx, c, out)
	}
}

// screenshotMidSale runs a sale of 6,000 units to 9,000 buyers with holds,
// some confirmed, and takes a picture of the page while it runs.
func screenshotMidSale(t *testing.T, ctx context.Context, c *nodetest.Cluster, out string) {
	t.Helper()
	if code, body := nodetest.Call(t, c.Client(c.IDs[0]), "PUT", "/v1/skus/phone", `{"total":6000,"hold_ttl":"1m"}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "phone")
	done := make(chan map[int]buyerResult)
	go func() { done <- buyWave(c, "phone", 10_000, 19_000, 24, nil) }()
	time.Sleep(2 * time.Second) // a moment into the sale, for the picture only
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s", out)
	acked := ackedOrders(t, <-done)
	if len(acked) != 6000 {
		t.Fatalf("%d buyers won 6,000 units", len(acked))
	}
	checkClusterLedgers(t, c, "phone", acked)
}
