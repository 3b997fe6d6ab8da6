package scenario

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/node/nodetest"
)

// seriesNames are the metric names the queries (lines with "expr") of an
// alert rules or dashboard file read.
func seriesNames(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `expr`) { // the queries, not the texts about them
			continue
		}
		for _, m := range regexp.MustCompile(`\b(stockd_[a-z_]+|up)\b`).FindAllString(line, -1) {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	slices.Sort(names)
	return names
}

// exportedNames are the metric names a node's /metrics has.
func exportedNames(t *testing.T, metricsText string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, line := range strings.Split(metricsText, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		out[name] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				out[base] = true
			}
		}
	}
	return out
}

// TestDeploy_AlertRulesReadWhatANodeExports: promtool checks the rules,
// and every metric they read is exported by a default single node (no
// TLS, no backups, no consumers): a renamed metric breaks this test.
func TestDeploy_AlertRulesReadWhatANodeExports(t *testing.T) {
	rules := filepath.Join(moduleDir(t), "deploy", "prometheus", "alerts.yml")
	if _, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command("promtool", "check", "rules", rules).CombinedOutput(); err != nil {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
	} else {
		t.Log("promtool is not installed (Debian's prometheus package): the rules' syntax is checked in CI")
	}
	n := nodetest.StartNode(t, t.TempDir())
	exported := exportedNames(t, nodetest.GetRaw(t, nodetest.ClientOf(n, 1), "/metrics"))
	for _, name := range seriesNames(t, rules) {
		if name != "up" && !exported[name] {
			t.Errorf("%s reads %s, which a default node does not export", filepath.Base(rules), name)
		}
	}
}

// prometheus runs a Prometheus server of the test's own on loopback,
// scraping targets every second with the rules at rules; it is stopped
// through its process handle.
func prometheus(t *testing.T, rules string, targets []string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian's prometheus package): the alert test runs in CI")
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [%q]\nscrape_configs:\n  - job_name: stockd\n    static_configs:\n      - targets: [%s]\n", rules, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("prometheus's log:\n%s", b[max(0, len(b)-4000):])
		}
	})
	nodetest.WaitFor(t, 30*time.Second, "prometheus ready", func() bool {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return "http://" + addr
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alerts are Prometheus's pending and firing alerts.
func alerts(t *testing.T, prom string) []promAlert {
	t.Helper()
	resp, err := http.Get(prom + "/api/v1/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Data.Alerts
}

// targetsUp reports how many of Prometheus's targets are up.
func targetsUp(t *testing.T, prom string) int {
	t.Helper()
	resp, err := http.Get(prom + "/api/v1/query?query=" + "sum(up%7Bjob%3D%22stockd%22%7D)")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Data.Result) != 1 {
		return 0
	}
	var n int
	fmt.Sscan(fmt.Sprint(out.Data.Result[0].Value[1]), &n)
	return n
}

// TestDeploy_AlertsOnARealPrometheus: a Prometheus of the test's own
// scrapes three nodes with deploy/prometheus/alerts.yml. Through a sale no
// alert is pending or firing (the drift alert stays quiet); once a node is
// killed, StockdNodeDown fires.
func TestDeploy_AlertsOnARealPrometheus(t *testing.T) {
	c := nodetest.StartCluster(t)
	var targets []string
	for _, id := range c.IDs {
		targets = append(targets, c.Node(id).HTTPAddr())
	}
	prom := prometheus(t, filepath.Join(moduleDir(t), "deploy", "prometheus", "alerts.yml"), targets)
	nodetest.WaitFor(t, 30*time.Second, "prometheus scraping the three nodes", func() bool { return targetsUp(t, prom) == 3 })

	if code, out := nodetest.Call(t, c.Client(c.Leader()), "PUT", "/v1/skus/pa", `{"total":3000}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, c, "pa")
	var wins, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.Client(c.IDs[w%3])
			for i := 0; i < 2000 && wins.Load() < 3000; i++ {
				code, _ := nodetest.CallQuiet(cl, "POST", "/v1/skus/pa/deduct", fmt.Sprintf(`{"user":"w%d-%d","request_id":"w%d-%d"}`, w, i, w, i))
				switch code {
				case 200:
					wins.Add(1)
				case 409, 429:
				default:
					failed.Add(1)
				}
			}
		}()
	}
	// Through the sale and a few evaluations after it: nothing pending or firing.
	quietUntil := time.Now().Add(8 * time.Second)
	for time.Now().Before(quietUntil) {
		if a := alerts(t, prom); len(a) > 0 {
			t.Fatalf("alerts on a healthy cluster during a sale: %+v", a)
		}
		time.Sleep(500 * time.Millisecond) // polling Prometheus's evaluations, not synchronising
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d deducts failed", failed.Load())
	}
	nodetest.CheckLedger(t, c.Client(c.Leader()), "pa")
	if a := alerts(t, prom); len(a) > 0 {
		t.Fatalf("alerts after the sale: %+v", a)
	}

	victim := c.Follower()
	c.Crash(victim)
	nodetest.WaitFor(t, 60*time.Second, "StockdNodeDown firing", func() bool {
		for _, a := range alerts(t, prom) {
			if a.Labels["alertname"] == "StockdNodeDown" && a.State == "firing" {
				return true
			}
		}
		return false
	})
	for _, a := range alerts(t, prom) {
		if a.Labels["alertname"] == "StockdAuditDrift" {
			t.Fatalf("the drift alert after a node was killed: %+v", a)
		}
	}
}

// TestDeploy_DashboardReadsWhatANodeExports: deploy/grafana/stockd.json is
// a dashboard (JSON with panels and their queries), and every metric its
// queries read is exported by a default single node holding one sale.
func TestDeploy_DashboardReadsWhatANodeExports(t *testing.T) {
	path := filepath.Join(moduleDir(t), "deploy", "grafana", "stockd.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil || dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("the dashboard: %v, %d panels", err, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
			t.Fatalf("panel %q has no query", p.Title)
		}
	}
	n := nodetest.StartNode(t, t.TempDir())
	c := nodetest.ClientOf(n, 1)
	if code, out := nodetest.Call(t, c, "PUT", "/v1/skus/d", `{"total":10}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	exported := exportedNames(t, nodetest.GetRaw(t, c, "/metrics"))
	for _, name := range seriesNames(t, path) {
		if name != "up" && !exported[name] {
			t.Errorf("the dashboard reads %s, which a default node does not export", name)
		}
	}
}

// TestDeploy_NoAlertOnAHealthyDefaultNode: a Prometheus scraping one node
// with default flags (no TLS, no backups, no consumers) evaluates every
// rule several times and finds nothing pending or firing.
func TestDeploy_NoAlertOnAHealthyDefaultNode(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	prom := prometheus(t, filepath.Join(moduleDir(t), "deploy", "prometheus", "alerts.yml"), []string{n.HTTPAddr()})
	nodetest.WaitFor(t, 30*time.Second, "prometheus scraping the node", func() bool { return targetsUp(t, prom) == 1 })
	for until := time.Now().Add(6 * time.Second); time.Now().Before(until); {
		if a := alerts(t, prom); len(a) > 0 {
			t.Fatalf("alerts on a healthy default node: %+v", a)
		}
		time.Sleep(500 * time.Millisecond) // polling Prometheus's evaluations, not synchronising
	}
}
