package scenario

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// reportSeries is what the browser draws of one strategy in one chart.
type reportSeries struct {
	Strategy string `json:"strategy"`
	Points   int    `json:"points"` // the polyline's
	Dots     int    `json:"dots"`
	Inside   bool   `json:"inside"` // every point within the plot's box
}

type reportChart struct {
	Title  string         `json:"title"`
	Legend []string       `json:"legend"`
	Series []reportSeries `json:"series"`
}

type reportPage struct {
	Ran     []string      `json:"ran"` // the table's rows that were not skipped
	Charts  []reportChart `json:"charts"`
	Terms   []string      `json:"terms"`
	Headers []string      `json:"headers"`
}

// readReportPage reads, from the page the browser shows, the table's
// rows, every chart's legend and what each series draws.
const readReportPage = `JSON.stringify({
  ran: [...document.querySelectorAll("table.runs tr")].filter(r => r.querySelector("td") && r.cells.length > 2).map(r => r.cells[0].innerText),
  headers: [...document.querySelectorAll("table.runs th")].map(h => h.innerText),
  terms: [...document.querySelectorAll("dl.terms dt")].map(d => d.innerText),
  charts: [...document.querySelectorAll("figure.chart")].map(f => ({
    title: f.querySelector("text").textContent,
    legend: [...f.querySelectorAll(".legend span")].map(s => s.innerText.replace(/^■ /, "").split(" ")[0]),
    series: [...f.querySelectorAll("g.series")].map(g => {
      const line = g.querySelector("polyline");
      const pts = line.points ? [...line.points] : [];
      const dots = [...g.querySelectorAll("circle")].map(c => ({x: c.cx.baseVal.value, y: c.cy.baseVal.value}));
      const all = pts.map(p => ({x: p.x, y: p.y})).concat(dots);
      return {strategy: g.dataset.strategy, points: pts.length, dots: dots.length,
        inside: all.length > 0 && all.every(p => p.x >= 0 && p.x <= 640 && p.y >= 0 && p.y <= 240)};
    }),
  })),
})`

// benchReportInBrowser runs stockd bench with args and -html, and opens
// the report in headless Chromium; it returns the browser and what the
// bench printed.
func benchReportInBrowser(t *testing.T, args ...string) (context.Context, string) {
	t.Helper()
	ctx := newBrowser(t)
	dir := t.TempDir()
	bin := buildStockd(t, dir)
	report := filepath.Join(dir, "report.html")
	runCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(runCtx, bin, append(append([]string{"bench"}, args...), "-html", report)...).CombinedOutput()
	if err != nil {
		t.Fatalf("stockd bench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "HTML report: "+report) {
		t.Fatalf("stockd bench did not say where the report went:\n%s", out)
	}
	if _, err := chromedp.Run(ctx, chromedp.Navigate("file://"+report)); err != nil {
		t.Fatal(err)
	}
	return ctx, string(out)
}

// TestBenchReport_EveryStrategyDrawn runs stockd bench as make bench does
// (a launched node, the flash scenario, every strategy that needs no
// server) with -html, opens the report in headless Chromium and checks
// what it draws: every strategy that ran is in its group's throughput
// chart as a line or a dot inside the plot, every legend entry is drawn,
// the columns and terms are named. STOCKD_BENCH_SCREENSHOT=file.png keeps
// a picture of it (make bench-screenshot: docs/bench-report.png).
func TestBenchReport_EveryStrategyDrawn(t *testing.T) {
	ctx, _ := benchReportInBrowser(t, "-launch", "1", "-scenario", "flash", "-units", "1000", "-requests", "30000", "-conns", "16")
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](readReportPage))
	if err != nil {
		t.Fatal(err)
	}
	var page reportPage
	if err := json.Unmarshal([]byte(raw), &page); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	for _, want := range []string{"stockd-commit", "stockd-batch", "noop", "inproc-mutex", "inproc-atomic", "inproc-buckets"} {
		if !slices.Contains(page.Ran, want) {
			t.Fatalf("the table's rows %v have no %s", page.Ran, want)
		}
	}
	for _, want := range []string{"deducts/s", "vs commit", "flips", "late wins", "tail", "server CPU a deduct"} {
		if !slices.Contains(page.Headers, want) {
			t.Errorf("the table has no column %q: %v", want, page.Headers)
		}
	}
	for _, want := range []string{"deducts/s", "p50 p99 p99.9", "vs commit", "flips", "late wins", "tail", "cpu per deduct"} {
		if !slices.Contains(page.Terms, want) {
			t.Errorf("the report does not explain %q: %v", want, page.Terms)
		}
	}
	drawn := map[string]bool{}
	for _, c := range page.Charts {
		for _, s := range c.Series {
			if !s.Inside || (s.Points < 2 && s.Dots == 0) {
				t.Errorf("chart %q: %s draws %d points and %d dots, inside the plot %v", c.Title, s.Strategy, s.Points, s.Dots, s.Inside)
			}
			if strings.HasPrefix(c.Title, "throughput") {
				drawn[s.Strategy] = true
			}
		}
		var names []string
		for _, s := range c.Series {
			names = append(names, s.Strategy)
		}
		if !slices.Equal(c.Legend, names) {
			t.Errorf("chart %q: legend %v, series drawn %v", c.Title, c.Legend, names)
		}
	}
	for _, s := range page.Ran {
		if !drawn[s] {
			t.Errorf("%s ran but no throughput chart draws it", s)
		}
	}
	if shot := os.Getenv("STOCKD_BENCH_SCREENSHOT"); shot != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s", shot)
	}
	t.Logf("%d charts; rows drawn: %v", len(page.Charts), page.Ran)
}

// TestBenchReport_QueueScenario runs stockd bench -scenario queue on a
// launched three-node cluster with -html and reads its table in headless
// Chromium: one row for the cluster, every user accounted for (bought,
// told sold out or admitted and never buying), no more bought than the
// units, each node's time to tell everyone, and the columns explained.
func TestBenchReport_QueueScenario(t *testing.T) {
	ctx, out := benchReportInBrowser(t, "-launch", "3", "-scenario", "queue", "-units", "300", "-requests", "2000",
		"-conns", "16", "-duration", "5s", "-queue-never", "0.5", "-queue-ttl", "1s")
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({
  head: [...document.querySelectorAll("table.queue th")].map(h => h.innerText),
  rows: [...document.querySelectorAll("table.queue tr")].filter(r => r.querySelector("td")).map(r => [...r.cells].map(c => c.innerText)),
  terms: [...document.querySelectorAll("dl.terms dt")].map(d => d.innerText),
})`))
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Head  []string   `json:"head"`
		Rows  [][]string `json:"rows"`
		Terms []string   `json:"terms"`
	}
	if err := json.Unmarshal([]byte(raw), &page); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if len(page.Rows) != 1 || len(page.Rows[0]) != len(page.Head) {
		t.Fatalf("the queue table: %v rows under %v\n%s", page.Rows, page.Head, out)
	}
	cell := func(name string) string {
		t.Helper()
		i := slices.Index(page.Head, name)
		if i < 0 {
			t.Fatalf("the queue table has no column %q: %v", name, page.Head)
		}
		return page.Rows[0][i]
	}
	num := func(name string) int {
		t.Helper()
		n, err := strconv.Atoi(cell(name))
		if err != nil {
			t.Fatalf("%s reads %q", name, cell(name))
		}
		return n
	}
	bought, soldOut, never := num("bought"), num("sold out"), num("never used")
	if bought != 300 || bought+soldOut+never != 2000 {
		t.Fatalf("bought %d, told sold out %d, never used %d: want 300 bought of 300 and all 2000 users accounted for\n%s", bought, soldOut, never, out)
	}
	if told := strings.Split(cell("each node's own figure"), ", "); len(told) != 3 {
		t.Fatalf("each node's time to tell everyone: %q", cell("each node's own figure"))
	}
	for _, term := range []string{"open shown", "last admitted", "told after", "ETA error"} {
		if !slices.Contains(page.Terms, term) {
			t.Errorf("the report does not explain %q: %v", term, page.Terms)
		}
	}
	t.Logf("the queue row: %v", page.Rows[0])
}
