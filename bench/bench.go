package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Main runs `stockd bench`. It returns an error when any strategy
// oversold or its own count does not add up.
func Main(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	bin := o.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return fmt.Errorf("find this executable: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "stockd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	t, stop, err := startTargets(&o, bin, dir)
	defer stop(stderr)
	if err != nil {
		return err
	}
	report := &Report{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Command: "stockd bench " + strings.Join(args, " "),
		Machine: fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()),
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	if i := slices.Index(o.Scenarios, overloadScenario); i >= 0 {
		if err := runOverload(ctx, &o, bin, dir, stdout); err != nil {
			return err
		}
		o.Scenarios = slices.Delete(o.Scenarios, i, i+1)
	}
	if i := slices.Index(o.Scenarios, lotteryScenario); i >= 0 {
		if err := runLotteries(ctx, &o, t, runID, stdout); err != nil {
			return err
		}
		o.Scenarios = slices.Delete(o.Scenarios, i, i+1)
	}
	if i := slices.Index(o.Scenarios, queueScenario); i >= 0 {
		if err := runQueues(ctx, &o, t, runID, report, stdout); err != nil {
			return err
		}
		o.Scenarios = slices.Delete(o.Scenarios, i, i+1)
	}
	if len(o.Scenarios) == 0 {
		if len(report.Queue) > 0 {
			return finishReport(report, &o, stdout)
		}
		return nil
	}
	var progress io.Writer
	if o.Progress {
		progress = stderr
	}
	for _, name := range o.Scenarios {
		if err := runScenario(ctx, &o, name, runID, t, bin, dir, report, progress); err != nil {
			return err
		}
	}
	return finishReport(report, &o, stdout)
}

// targets are the stockd clusters the rows run against: launched ones
// (kept up for every scenario) or the -target ones.
type targets struct {
	sets [][]string // each cluster's node URLs
	pids [][]int    // each launched cluster's node pids; none for -target
	how  []Launch   // how each launched cluster was started; none for -target
}

// startTargets launches o's clusters, or takes its -target nodes. stop
// ends what it launched, even after an error.
func startTargets(o *Options, bin, dir string) (targets, func(io.Writer), error) {
	var t targets
	var launched []*launched
	stop := func(stderr io.Writer) {
		for _, l := range launched {
			if err := l.stop(); err != nil {
				fmt.Fprintln(stderr, "stop launched node:", err)
			}
		}
	}
	if len(o.Launches) == 0 {
		if len(o.Targets) > 0 {
			t.sets = [][]string{o.Targets}
		}
		return t, stop, nil
	}
	for i, ln := range o.Launches {
		var sec *launchTLS
		if ln.TLS || ln.PeerTLS {
			var err error
			if sec, err = makeLaunchCerts(bin, dir+"/certs", ln.TLS); err != nil {
				return t, stop, err
			}
			if ln.TLS && o.TLS == nil {
				o.TLS = sec.client
			}
		}
		nodes, err := launchCluster(bin, fmt.Sprintf("%s/c%d", dir, i), ln.Nodes, ln.NoFeed, sec, o.NodeArgs...)
		launched = append(launched, nodes...)
		if err != nil {
			return t, stop, err
		}
		var urls []string
		var pids []int
		for _, l := range nodes {
			urls = append(urls, l.url)
			pids = append(pids, l.cmd.Process.Pid)
		}
		t.sets, t.pids, t.how = append(t.sets, urls), append(t.pids, pids), append(t.how, ln)
	}
	return t, stop, nil
}

// runLotteries runs the lottery scenario against every target cluster.
func runLotteries(ctx context.Context, o *Options, t targets, runID string, stdout io.Writer) error {
	if len(t.sets) == 0 {
		return fmt.Errorf("-scenario %s needs -launch or -target", lotteryScenario)
	}
	var results []lotteryResult
	for j, nodes := range t.sets {
		var pids []int
		if j < len(t.pids) {
			pids = t.pids[j]
		}
		r, err := runLottery(ctx, o, nodes, pids, lotteryLabel(nodes), runID+"-"+strconv.Itoa(j))
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	writeLotteryResults(stdout, o, results)
	return nil
}

// runScenario runs one scenario's rows, a strategy each, into report.
func runScenario(ctx context.Context, o *Options, name, runID string, t targets, bin, dir string, report *Report, progress io.Writer) error {
	sc, err := NewScenario(name, o, runID)
	if err != nil {
		return err
	}
	strategies, skipped := buildStrategies(ctx, o, t.sets, t.pids, t.how, bin, dir)
	for _, why := range skipped {
		report.Runs = append(report.Runs, &Run{Scenario: name, Strategy: why[0], Skipped: why[1], Total: sc.TotalUnits()})
	}
	for i, st := range strategies {
		// Each strategy gets its own SKUs and request ids: two rows
		// against the same stockd nodes must not meet each other's
		// sales (a request id that won in one row would answer the
		// next row with its old order).
		sc, err := NewScenario(name, o, runID+"-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		cpu := startCPUMeter(st)
		feed := startFeedReader(ctx, st, o.FeedReader)
		run, err := runOne(ctx, st, sc, o, progress)
		if err == nil {
			cpu.record(run)
			feed.record(run)
		} else {
			feed.stop()
		}
		st.Close()
		if err != nil {
			return err
		}
		report.Runs = append(report.Runs, run)
	}
	sortRuns(report.Runs)
	return nil
}

// finishReport prints the tables, writes the JSON and HTML reports asked
// for, and fails when a row's check failed.
func finishReport(report *Report, o *Options, stdout io.Writer) error {
	report.setRatios()
	if len(report.Runs) > 0 {
		report.PrintTables(stdout)
	}
	if o.JSONPath != "" {
		if err := report.WriteJSON(o.JSONPath); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "JSON report: %s\n", absPath(o.JSONPath))
	}
	if o.HTMLPath != "" {
		if err := report.WriteHTML(o.HTMLPath); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "HTML report: %s (open it in a browser; it needs nothing else)\n", absPath(o.HTMLPath))
	}
	if bad := report.Failed(); len(bad) > 0 {
		return errors.New("check failed: " + strings.Join(bad, "; "))
	}
	return nil
}

// absPath is path made absolute where it can be, for a line that says
// where a report went.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// buildStrategies makes every selected strategy that can run, and a
// one-line reason for each that cannot.
func buildStrategies(ctx context.Context, o *Options, targetSets [][]string, targetPIDs [][]int, targetHow []Launch, bin, dir string) ([]Strategy, [][2]string) {
	want := func(name string) bool { return len(o.Strategies) == 0 || slices.Contains(o.Strategies, name) }
	var out []Strategy
	var skipped [][2]string
	for _, mode := range []string{"stockd-commit", "stockd-none"} {
		if !want(mode) {
			continue
		}
		if len(targetSets) == 0 {
			skipped = append(skipped, [2]string{mode, "no -target or -launch given"})
		}
		for i, targets := range targetSets {
			st := newStockd(targets, o.Conns, o.AdminToken, o.ServiceToken, mode == "stockd-none", o.TLS)
			if i < len(targetPIDs) {
				st.pids = targetPIDs[i]
			}
			if i < len(targetHow) {
				st.noFeed, st.peerTLS = targetHow[i].NoFeed, targetHow[i].PeerTLS
			}
			st.noAudit = o.NoFinalAudit
			out = append(out, st)
		}
	}
	if want("stockd-batch") {
		if len(targetSets) == 0 {
			skipped = append(skipped, [2]string{"stockd-batch", "no -target or -launch given"})
		}
		for i, targets := range targetSets {
			st := newStockdBatch(targets, o.Conns, o.AdminToken, o.ServiceToken, o.TLS)
			if i < len(targetPIDs) {
				st.pids = targetPIDs[i]
			}
			if i < len(targetHow) {
				st.noFeed, st.peerTLS = targetHow[i].NoFeed, targetHow[i].PeerTLS
			}
			st.noAudit = o.NoFinalAudit
			out = append(out, st)
		}
	}
	if want("noop") {
		if n, err := newNoop(bin, dir, o.Conns); err != nil {
			skipped = append(skipped, [2]string{"noop", err.Error()})
		} else {
			out = append(out, n)
		}
	}
	for name, mk := range map[string]func() Strategy{"inproc-mutex": newInprocMutex, "inproc-atomic": newInprocAtomic, "inproc-buckets": newInprocBuckets} {
		if want(name) {
			out = append(out, mk())
		}
	}
	if want("redis-lua") {
		if o.Redis == "" {
			skipped = append(skipped, [2]string{"redis-lua", "no -redis address given"})
		} else if r, err := newRedis(ctx, o); err != nil {
			skipped = append(skipped, [2]string{"redis-lua", err.Error()})
		} else {
			out = append(out, r)
		}
	}
	for _, name := range []string{"pg-optimistic", "pg-pessimistic"} {
		if !want(name) {
			continue
		}
		if o.Postgres == "" {
			skipped = append(skipped, [2]string{name, "no -postgres DSN given"})
		} else if p, err := newPostgres(ctx, o.Postgres, o.Conns, name == "pg-pessimistic"); err != nil {
			skipped = append(skipped, [2]string{name, err.Error()})
		} else {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, func(a, b Strategy) int { return strategyRank(a.Name()) - strategyRank(b.Name()) })
	return out, skipped
}

func strategyRank(name string) int {
	base, _, _ := strings.Cut(name, " ")
	return slices.Index(strategyNames, base)
}

// sortRuns keeps each scenario's rows together in strategy order.
func sortRuns(runs []*Run) {
	order := map[string]int{}
	for _, r := range runs {
		if _, ok := order[r.Scenario]; !ok {
			order[r.Scenario] = len(order)
		}
	}
	slices.SortStableFunc(runs, func(a, b *Run) int {
		if d := order[a.Scenario] - order[b.Scenario]; d != 0 {
			return d
		}
		return strategyRank(a.Strategy) - strategyRank(b.Strategy)
	})
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
