package bench

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"stockd.dev/stockd/bench/queuebench"
)

// Report is every run of one bench invocation.
type Report struct {
	Date    string `json:"date"`
	Command string `json:"command"`
	Machine string `json:"machine"`
	Runs    []*Run `json:"runs"`
	// Queue holds the queue scenario's runs, one per set of nodes.
	Queue []queuebench.Result `json:"queue,omitempty"`
}

// Failed reports the runs whose check failed: oversold units, a store
// whose own count does not add up, a flipped request id or a late win.
func (r *Report) Failed() []string {
	var bad []string
	for _, run := range r.Runs {
		if run.Skipped != "" {
			continue
		}
		if run.Oversold != 0 || !run.Final.Valid {
			bad = append(bad, fmt.Sprintf("%s/%s: oversold %d, own count valid %v %s", run.Scenario, run.Strategy, run.Oversold, run.Final.Valid, run.Final.Detail))
		}
		if run.Flips != 0 || run.LateWins != 0 {
			bad = append(bad, fmt.Sprintf("%s/%s: %d flipped request ids, %d late wins", run.Scenario, run.Strategy, run.Flips, run.LateWins))
		}
	}
	for _, q := range r.Queue {
		if int64(q.Bought) > q.Units {
			bad = append(bad, fmt.Sprintf("queue/%s: %d bought of %d units", q.Label, q.Bought, q.Units))
		}
	}
	return bad
}

// setRatios fills VsStockd (the tables' "vs commit"): each row's rate
// over the first stockd-commit row of its scenario.
func (r *Report) setRatios() {
	base := map[string]float64{}
	for _, run := range r.Runs {
		if run.Skipped == "" && strings.HasPrefix(run.Strategy, "stockd-commit") {
			if _, ok := base[run.Scenario]; !ok {
				base[run.Scenario] = run.Rate
			}
		}
	}
	for _, run := range r.Runs {
		if b := base[run.Scenario]; b > 0 && run.Skipped == "" {
			run.VsStockd = run.Rate / b
		}
	}
}

// terms explain the tables' columns and the check lines under them, in
// the text tables and the HTML report alike.
var terms = [][2]string{
	{"deducts/s", "deducts answered a second, wins and losses alike; a deduct is one buyer's request (the batch row sends " + fmt.Sprint(batchSize) + " in one HTTP request)"},
	{"p50 p99 p99.9", "latency of one HTTP request as the client timed it, send to answer; marked * where a request carries many deducts (the batch row: one request of " + fmt.Sprint(batchSize) + ")"},
	{"wins", "distinct orders won"},
	{"losses", "definite refusals, by reason (sold_out, user_limit, ...)"},
	{"errors", "answers that were neither: transport errors, 5xx, timeouts"},
	{"oversold", "units sold past the stock on sale, by the client's kept wins or the strategy's own count; must be 0"},
	{"vs commit", "the row's deducts/s over the stockd-commit row's in the same run (1.00: level with it); the noop row is the HTTP floor, a server that answers sold_out and stores nothing"},
	{"flips", "request ids answered a win once and a loss another time; must be 0"},
	{"late wins", "wins of deducts sent after a sold_out answer for their SKU had reached the client; must be 0"},
	{"tail", "from the first sold_out answer to the last win of the same SKU (the longest over SKUs): how long the end of the sale stays uncertain"},
	{"cpu per deduct", "CPU time (user + system, from /proc) a deduct: the client (this process) and the server processes the harness launched"},
}

// PrintTables writes one table per scenario, what its terms mean, and
// each row's checks.
func (r *Report) PrintTables(w io.Writer) {
	durW := len("durability")
	for _, run := range r.Runs {
		durW = max(durW, len(run.Durability))
	}
	var scenario string
	for _, run := range r.Runs {
		if run.Scenario != scenario {
			scenario = run.Scenario
			fmt.Fprintf(w, "\nscenario %s (%d units on sale)\n", scenario, run.Total)
			fmt.Fprintf(w, "%-33s %-*s %10s %9s %9s %9s %8s %-28s %6s %8s %9s\n",
				"strategy", durW, "durability", "deducts/s", "p50", "p99", "p99.9", "wins", "losses", "errors", "oversold", "vs commit")
		}
		if run.Skipped != "" {
			fmt.Fprintf(w, "%-33s skipped: %s\n", run.Strategy, run.Skipped)
			continue
		}
		oversold := fmt.Sprint(run.Oversold)
		if !run.Final.Valid {
			oversold += " (count FAILED: " + run.Final.Detail + ")"
		}
		ratio := "-"
		if run.VsStockd > 0 {
			ratio = fmt.Sprintf("%.2f", run.VsStockd)
		}
		mark := ""
		if run.PerCall > 1 {
			mark = "*"
		}
		fmt.Fprintf(w, "%-33s %-*s %10.0f %9s %9s %9s %8d %-28s %6d %8s %9s\n",
			run.Strategy, durW, run.Durability, run.Rate, fmtDur(run.Latency.P50)+mark, fmtDur(run.Latency.P99)+mark, fmtDur(run.Latency.P999)+mark,
			run.Wins, lossText(run.Losses), run.Errors, oversold, ratio)
		for _, n := range run.ErrorNotes {
			fmt.Fprintf(w, "%-33s   error: %s\n", "", trunc(n, 120))
		}
	}
	fmt.Fprintln(w)
	for _, t := range terms {
		fmt.Fprintf(w, "  %-15s %s\n", t[0], t[1])
	}
	fmt.Fprintln(w)
	for _, run := range r.Runs {
		if run.Skipped == "" {
			fmt.Fprintf(w, "oversold: %d  flips: %d  late wins: %d  tail: %s  cpu per deduct: client %.1f µs, server %s  (%s, %s)\n", run.Oversold, run.Flips, run.LateWins,
				fmtDur(time.Duration(run.TailMs*float64(time.Millisecond))), run.ClientCPUus, serverCPUText(run), run.Scenario, run.Strategy)
			if run.FeedEvents > 0 || run.FeedNote != "" {
				fmt.Fprintf(w, "    order feed read during the row: %d events, %.0f/s, %d behind the head at the end %s\n", run.FeedEvents, run.FeedPerSec, run.FeedBehind, run.FeedNote)
			}
		}
	}
}

// serverCPUText is a row's server CPU per deduct, or why there is none.
func serverCPUText(run *Run) string {
	switch {
	case strings.HasPrefix(run.Strategy, "inproc-"):
		return "none (in process)"
	case run.ServerCPUus == 0:
		return "not measured (not launched by the harness)"
	}
	return fmt.Sprintf("%.1f µs", run.ServerCPUus)
}

func lossText(losses map[string]int) string {
	keys := make([]string, 0, len(losses))
	for k := range losses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%d", k, losses[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%dns", d.Nanoseconds())
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// chart is one SVG line chart of the HTML report.
type chart struct {
	Title  string
	YLabel string
	Lines  []chartLine
	MaxX   float64
	MaxY   float64
}

// chartLine is one run's series: a polyline through its points, and a dot
// on each when there are few (a run inside one sample is one dot).
type chartLine struct {
	Name   string
	Note   string // beside the legend's name
	Color  string
	Points string // SVG polyline points in chart coordinates
	Dots   [][2]float64
}

const (
	chartW, chartH = 640.0, 240.0
	dotsMax        = 40 // a series with more points is drawn as a line alone
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22"}

// throughputPoints are a run's deducts a second over time, each at the
// middle of its slot; a last slot under a quarter of the one before is
// folded into it (a few requests over a sliver of time would draw a
// spike).
func throughputPoints(run *Run) [][2]float64 {
	var pts [][2]float64
	var n, secs, at float64
	for i, s := range run.Timeline {
		if s.Seconds <= 0 {
			continue
		}
		if i > 0 && i == len(run.Timeline)-1 && len(pts) > 0 && s.Seconds < secs/4 {
			n, secs = n+float64(s.Requests), secs+s.Seconds
			pts[len(pts)-1] = [2]float64{at + secs/2, n / secs}
			continue
		}
		n, secs, at = float64(s.Requests), s.Seconds, s.AtSec
		pts = append(pts, [2]float64{at + secs/2, n / secs})
	}
	return pts
}

// timelineCharts are throughput, mean latency and stock over time for one
// group of runs; a chart none of the runs has points for is left out.
func timelineCharts(group string, runs []*Run) []chart {
	all := []chart{
		buildChart("throughput, "+group, "deducts/s", runs, throughputPoints),
		buildChart("mean latency of a request, "+group, "ms", runs, func(run *Run) [][2]float64 {
			var pts [][2]float64
			for _, s := range run.Timeline {
				if s.Requests > 0 {
					pts = append(pts, [2]float64{s.AtSec + max(s.Seconds, 0)/2, s.MeanLatency})
				}
			}
			return pts
		}),
		buildChart("stock remaining, "+group, "units", runs, func(run *Run) [][2]float64 {
			var pts [][2]float64
			for _, s := range run.Stock {
				pts = append(pts, [2]float64{s.AtSec, float64(s.Remaining)})
			}
			return pts
		}),
	}
	var out []chart
	for _, c := range all {
		if len(c.Lines) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// buildChart draws each run's points; a run with none gets no line and
// no legend entry.
func buildChart(title, ylabel string, runs []*Run, pick func(*Run) [][2]float64) chart {
	c := chart{Title: title, YLabel: ylabel}
	series := make([][][2]float64, len(runs))
	for i, run := range runs {
		series[i] = pick(run)
		for _, p := range series[i] {
			c.MaxX, c.MaxY = max(c.MaxX, p[0]), max(c.MaxY, p[1])
		}
	}
	if c.MaxX == 0 {
		c.MaxX = 1
	}
	if c.MaxY == 0 {
		c.MaxY = 1
	}
	for i, run := range runs {
		if len(series[i]) == 0 {
			continue
		}
		line := chartLine{Name: run.Strategy, Color: palette[i%len(palette)]}
		var pts []string
		for _, p := range series[i] {
			x, y := p[0]/c.MaxX*chartW, chartH-p[1]/c.MaxY*chartH
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			if len(series[i]) <= dotsMax {
				line.Dots = append(line.Dots, [2]float64{x, y})
			}
		}
		line.Points = strings.Join(pts, " ")
		if len(series[i]) == 1 {
			line.Note = fmt.Sprintf("(one sample: it ran %.3g s)", run.ElapsedSec)
		}
		c.Lines = append(c.Lines, line)
	}
	return c
}

var htmlReport = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur":  func(d time.Duration) string { return fmtDur(d) },
	"f0":   func(v float64) string { return fmt.Sprintf("%.0f", v) },
	"f1":   func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"f2":   func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"g":    func(v float64) string { return fmt.Sprintf("%.3g", v) },
	"loss": lossText,
	"join": func(s []string) string { return strings.Join(s, ", ") },
	"i64":  func(n int) int64 { return int64(n) },
	"pct":  func(v float64) float64 { return v * 100 },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>stockd bench {{.Report.Date}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,td:nth-child(2),th{text-align:left}.bad{color:#c00;font-weight:bold}
svg{background:#fafafa;border:1px solid #ddd;margin:0.5em 1em 0.5em 0}.legend span{margin-right:1em}
dl.terms{display:grid;grid-template-columns:max-content auto;gap:2px 1em;font-size:90%}dl.terms dt{font-weight:bold}dl.terms dd{margin:0}
</style></head><body>
<h1>stockd bench</h1>
<p>{{.Report.Date}} · <code>{{.Report.Command}}</code> · {{.Report.Machine}}</p>
{{range .Scenarios}}
<h2>scenario {{.Name}} ({{.Units}} units)</h2>
<table class="runs"><tr><th>strategy</th><th>durability</th><th>deducts/s</th><th>p50</th><th>p99</th><th>p99.9</th><th>wins</th><th>losses</th><th>errors</th><th>oversold</th><th>vs commit</th><th>flips</th><th>late wins</th><th>tail</th><th>server CPU a deduct</th></tr>
{{range .Runs}}{{if .Skipped}}<tr><td>{{.Strategy}}</td><td colspan="14" style="text-align:left">skipped: {{.Skipped}}</td></tr>
{{else}}{{$m := ""}}{{if gt .PerCall 1}}{{$m = "*"}}{{end}}<tr><td>{{.Strategy}}</td><td>{{.Durability}}</td><td>{{f0 .Rate}}</td><td>{{dur .Latency.P50}}{{$m}}</td><td>{{dur .Latency.P99}}{{$m}}</td><td>{{dur .Latency.P999}}{{$m}}</td><td>{{.Wins}}</td><td>{{loss .Losses}}</td><td>{{.Errors}}</td><td{{if or .Oversold (not .Final.Valid)}} class="bad"{{end}}>{{.Oversold}}{{if not .Final.Valid}} (count failed){{end}}</td><td>{{if .VsStockd}}{{f2 .VsStockd}}{{else}}-{{end}}</td><td{{if .Flips}} class="bad"{{end}}>{{.Flips}}</td><td{{if .LateWins}} class="bad"{{end}}>{{.LateWins}}</td><td>{{f1 .TailMs}} ms</td><td>{{if .ServerCPUus}}{{f1 .ServerCPUus}} µs{{else}}-{{end}}</td></tr>
{{end}}{{end}}</table>
{{range .Charts}}<figure class="chart" style="display:inline-block;margin:0"><svg width="700" height="290" viewBox="-50 -30 700 290">
<text x="0" y="-12" font-size="14">{{.Title}}</text>
<line x1="0" y1="240" x2="640" y2="240" stroke="#999"/><line x1="0" y1="0" x2="0" y2="240" stroke="#999"/>
<text x="-6" y="4" font-size="10" text-anchor="end">{{g .MaxY}}</text><text x="-6" y="244" font-size="10" text-anchor="end">0</text>
<text x="640" y="255" font-size="10" text-anchor="end">{{g .MaxX}} s</text><text x="4" y="12" font-size="10">{{.YLabel}}</text>
{{range .Lines}}<g class="series" data-strategy="{{.Name}}"><polyline fill="none" stroke="{{.Color}}" stroke-width="1.5" points="{{.Points}}"/>{{$c := .Color}}{{range .Dots}}<circle cx="{{f1 (index . 0)}}" cy="{{f1 (index . 1)}}" r="3.5" fill="{{$c}}"/>{{end}}</g>{{end}}
</svg>
<figcaption class="legend">{{range .Lines}}<span style="color:{{.Color}}">■ {{.Name}}{{if .Note}} {{.Note}}{{end}}</span>{{end}}</figcaption></figure>
{{end}}{{end}}
{{if .Report.Queue}}<h2>scenario queue</h2>
<table class="queue"><tr><th>nodes</th><th>users</th><th>units</th><th>joins/s</th><th>cpu/join</th><th>open shown</th><th>last admitted</th><th>all answered</th><th>told after</th><th>each node's own figure</th><th>bought</th><th>sold out</th><th>never used</th><th>rank correlation</th><th>ETA error median</th><th>p90</th><th>ETA went up</th><th>cpu/bought</th><th>cpu/plain</th></tr>
{{range .Report.Queue}}<tr><td>{{.Label}}</td><td>{{.Users}}</td><td>{{.Units}}</td><td>{{f0 .Joins.Rate}}</td><td>{{.Joins.CPUEach}}</td><td>{{dur .OpenShown}}</td><td>{{dur .LastAdmitted}}</td><td>{{dur .AllAnswered}}</td><td>{{dur .ToldSoldOut}}</td><td>{{join .NodesTold}}</td><td{{if gt (i64 .Bought) .Units}} class="bad"{{end}}>{{.Bought}}</td><td>{{.SoldOutTickets}}</td><td>{{.NeverUsed}}</td><td>{{printf "%+.4f" .RankCorr}}</td><td>{{dur .ETA.Median}}</td><td>{{dur .ETA.P90}}</td><td>{{printf "%.1f%%" (pct .ETA.WentUp)}} of {{.ETA.Pairs}} ({{.ETA.UsersUp}} users)</td><td>{{.Follow.CPUEach}}</td><td>{{.Plain.CPUEach}}</td></tr>
{{end}}</table>
<dl class="terms">{{range .QueueTerms}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl>
{{end}}
<h2>Reading the tables</h2>
<dl class="terms">{{range .Terms}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl>
</body></html>
`))

// WriteHTML writes a self-contained report: the tables, what their terms
// mean, and, per scenario, throughput, latency and remaining stock over
// time as inline SVG.
func (r *Report) WriteHTML(path string) error {
	type scenarioView struct {
		Name   string
		Units  int64
		Runs   []*Run
		Charts []chart
	}
	var views []*scenarioView
	index := map[string]*scenarioView{}
	for _, run := range r.Runs {
		v, ok := index[run.Scenario]
		if !ok {
			v = &scenarioView{Name: run.Scenario, Units: run.Total}
			index[run.Scenario] = v
			views = append(views, v)
		}
		v.Runs = append(v.Runs, run)
	}
	for _, v := range views {
		// In-process counters run at millions a second: on one panel with
		// the servers they would flatten every server's line.
		var served, inproc []*Run
		for _, run := range v.Runs {
			switch {
			case run.Skipped != "":
			case strings.HasPrefix(run.Strategy, "inproc-"):
				inproc = append(inproc, run)
			default:
				served = append(served, run)
			}
		}
		for _, group := range []struct {
			label string
			runs  []*Run
		}{{"servers", served}, {"in-process counters", inproc}} {
			if len(group.runs) > 0 {
				v.Charts = append(v.Charts, timelineCharts(group.label, group.runs)...)
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := htmlReport.Execute(f, map[string]any{"Report": r, "Scenarios": views, "Terms": terms, "QueueTerms": queuebench.Terms}); err != nil {
		return fmt.Errorf("render %s: %w", path, err)
	}
	return f.Close()
}
