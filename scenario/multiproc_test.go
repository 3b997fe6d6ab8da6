package scenario

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/client"
	"stockd.dev/stockd/internal/loopport"
	"stockd.dev/stockd/node/nodetest"
)

// The multi-process test runs the real binary as three processes. It is
// slower than the in-process tests and runs on its own target:
//
//	make test-multiproc   (STOCKD_MULTIPROC=1 go test -run MultiProcess .)

// procCluster is three stockd processes on loopback, each stopped through
// its own process handle.
type procCluster struct {
	t        *testing.T
	bin      string
	ids      []string
	httpAddr map[string]string
	raftAddr map[string]string
	dataDir  map[string]string
	peers    string
	// extraArgs are added to every node's command line.
	extraArgs []string
	// sec, when set, runs the cluster on node certificates and HTTPS
	// (and, with hosts, each node in its own network namespace).
	sec *procSecurity

	mu      sync.Mutex
	procs   map[string]*exec.Cmd
	exited  map[string]chan error
	clients map[string]*fasthttp.HostClient
}

func (p *procCluster) NodeIDs() []string { return p.ids }

func (p *procCluster) Client(id string) *fasthttp.HostClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clients[id]
}

// freePort is a loopback port for a node process this test starts: below
// the kernel's ephemeral range, and never one handed out before in this
// process (a node given the same port for -http and -raft, or another
// node's, would not start).
func freePort(t *testing.T) string {
	t.Helper()
	addr, err := loopport.Free()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// buildStockd builds this module's binary into dir.
func buildStockd(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "stockd")
	if out, err := exec.Command("go", "build", "-o", bin, "stockd.dev/stockd").CombinedOutput(); err != nil {
		t.Fatalf("build stockd: %v\n%s", err, out)
	}
	return bin
}

func startProcCluster(t *testing.T, extraArgs ...string) *procCluster {
	t.Helper()
	return startProcClusterOf(t, buildStockd(t, t.TempDir()), extraArgs...)
}

// startProcClusterOf is startProcCluster with the binary bin.
func startProcClusterOf(t *testing.T, bin string, extraArgs ...string) *procCluster {
	t.Helper()
	return startProcClusterSecured(t, bin, nil, extraArgs...)
}

// startProcClusterSecured is startProcClusterOf on sec's certificates
// (nil: the cluster secret, plain HTTP).
func startProcClusterSecured(t *testing.T, bin string, sec *procSecurity, extraArgs ...string) *procCluster {
	t.Helper()
	p := newProcCluster(t, bin, sec, extraArgs...)
	p.startAll()
	return p
}

// newProcCluster chooses the nodes' addresses and data dirs and registers
// their stop; startAll starts them.
func newProcCluster(t *testing.T, bin string, sec *procSecurity, extraArgs ...string) *procCluster {
	t.Helper()
	dir := t.TempDir()
	p := &procCluster{t: t, bin: bin, ids: []string{"n1", "n2", "n3"},
		httpAddr: map[string]string{}, raftAddr: map[string]string{}, dataDir: map[string]string{},
		procs: map[string]*exec.Cmd{}, exited: map[string]chan error{}, clients: map[string]*fasthttp.HostClient{},
		extraArgs: extraArgs, sec: sec}
	var peers []string
	for _, id := range p.ids {
		p.httpAddr[id], p.raftAddr[id] = freePort(t), freePort(t)
		if host := sec.host(id); host != "" {
			p.httpAddr[id], p.raftAddr[id] = net.JoinHostPort(host, "8080"), net.JoinHostPort(host, "7000")
		}
		p.dataDir[id] = filepath.Join(dir, id)
		peers = append(peers, id+"="+p.raftAddr[id])
	}
	p.peers = strings.Join(peers, ",")
	t.Cleanup(p.stopAll)
	t.Cleanup(p.logTailsIfFailed) // runs after stopAll: the logs are complete
	return p
}

// startAll starts every node and waits until the cluster is ready.
func (p *procCluster) startAll() {
	p.t.Helper()
	for _, id := range p.ids {
		p.Start(id)
	}
	nodetest.WaitReady(p.t, p)
}

func (p *procCluster) Start(id string) {
	p.t.Helper()
	logFile, err := os.OpenFile(p.dataDir[id]+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	args := []string{"serve", "-id", id, "-http", p.httpAddr[id], "-raft", p.raftAddr[id],
		"-data", p.dataDir[id], "-peers", p.peers, "-lease-idle-return", "300ms", "-reclaim-after", "3s", "-log-level", cmpOr(os.Getenv("STOCKD_TEST_LOG_LEVEL"), "warn")}
	args = append(args, p.sec.nodeArgs(id)...)
	cmd := p.sec.command(id, p.bin, append(args, p.extraArgs...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", id, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logFile.Close() }()
	p.mu.Lock()
	p.procs[id], p.exited[id] = cmd, exited
	p.clients[id] = p.sec.client(p.httpAddr[id])
	p.mu.Unlock()
}

// logTailsLines is how much of each node's log a failed test shows.
const logTailsLines = 60

// logTailsIfFailed shows the end of every node's log when the test failed.
func (p *procCluster) logTailsIfFailed() {
	if !p.t.Failed() {
		return
	}
	for _, id := range p.ids {
		b, err := os.ReadFile(p.dataDir[id] + ".log")
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		p.t.Logf("--- last %d lines of %s's log:\n%s", logTailsLines, id, strings.Join(lines[max(0, len(lines)-logTailsLines):], "\n"))
	}
}

// detach takes node id's process handle out of the cluster (nil: not
// running), for the caller to stop it.
func (p *procCluster) detach(id string) (*exec.Cmd, chan error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd, exited := p.procs[id], p.exited[id]
	p.procs[id], p.clients[id] = nil, nil
	return cmd, exited
}

// signal sends sig to node id through its process handle.
func (p *procCluster) signal(id string, sig os.Signal) {
	p.mu.Lock()
	cmd := p.procs[id]
	p.mu.Unlock()
	if cmd == nil {
		p.t.Fatalf("%s is not running", id)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %s: %v", id, err)
	}
}

// kill sends SIGKILL to one node through its process handle.
func (p *procCluster) kill(id string) {
	cmd, exited := p.detach(id)
	cmd.Process.Kill()
	<-exited
}

// stopAll sends SIGTERM to every running node and waits, killing a node
// that does not stop in time.
func (p *procCluster) stopAll() {
	for _, id := range p.ids {
		p.stop(id)
	}
}

// stop sends SIGTERM to one node through its process handle and waits,
// killing it if it does not stop in time.
func (p *procCluster) stop(id string) {
	cmd, exited := p.detach(id)
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			p.t.Errorf("%s: %v", id, err)
		}
	case <-time.After(20 * time.Second):
		p.t.Errorf("%s did not stop on SIGTERM within 20s; killing it", id)
		cmd.Process.Kill()
		<-exited
	}
}

func (p *procCluster) Leader() string {
	for _, id := range p.ids {
		if c := p.Client(id); c != nil {
			if code, st := nodetest.CallQuiet(c, "GET", "/v1/cluster", ""); code == 200 {
				if l, _ := st["leader"].(string); l != "" {
					return l
				}
			}
		}
	}
	return ""
}

func TestMultiProcess_LeaderKilledMidSale(t *testing.T) {
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run three stockd processes")
	}
	leaderKilledMidSale(t, startProcCluster(t))
}

// leaderKilledMidSale sells 3,000 units to 6,000 buyers (each re-sending
// its request id until it has an answer, to any node), kills the leader
// with SIGKILL mid-sale and restarts it: nothing is oversold or
// acknowledged twice, every acknowledged order is in every ledger, the
// ledgers agree and obey the law.
func leaderKilledMidSale(t *testing.T, p *procCluster) {
	t.Helper()
	const units, buyers, calm = 3000, 6000, 1000
	if code, body := nodetest.Call(t, p.Client("n1"), "PUT", "/v1/skus/tv", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	if code, body := nodetest.Call(t, p.Client("n1"), "PUT", "/v1/skus/probe", `{"total":1000000}`); code != 201 {
		t.Fatalf("create probe sale: %d %v", code, body)
	}
	var acked atomic.Int64
	first := buyWave(p, "tv", 0, calm, 16, &acked)
	waveDone := make(chan map[int]buyerResult, 1)
	go func() { waveDone <- buyWave(p, "tv", calm, buyers, 16, &acked) }()

	leader := p.Leader()
	if leader == "" {
		t.Fatal("no leader mid-sale")
	}
	var survivor string
	for _, id := range p.ids {
		if id != leader {
			survivor = id
			break
		}
	}
	killedAt := time.Now()
	p.kill(leader)
	// Failover: from the kill to the first deduct committed through a
	// surviving node (which needs a new leader).
	var failover time.Duration
	nodetest.WaitFor(t, 30*time.Second, "a deduct committed after the kill", func() bool {
		code, _ := nodetest.CallQuiet(p.Client(survivor), "POST", "/v1/skus/probe/deduct",
			fmt.Sprintf(`{"user":"probe","request_id":"probe-%d"}`, time.Now().UnixNano()))
		if code == 200 {
			failover = time.Since(killedAt)
			return true
		}
		return false
	})
	t.Logf("killed leader %s after %d acknowledgements; failover (kill to first committed deduct) %s", leader, acked.Load(), failover.Round(time.Millisecond))
	at := acked.Load()
	nodetest.WaitFor(t, 30*time.Second, "sales go on without the old leader", func() bool { return acked.Load() >= at+200 })
	p.Start(leader)
	second := <-waveDone
	for b, r := range second {
		first[b] = r
	}
	nodetest.WaitReady(t, p)
	restStart := time.Now()
	rest := sellOut(t, p, "tv", units, buyers)
	t.Logf("after the first wave: %d acknowledged; sell-out of the rest took %s", len(ackedOrders(t, first)), time.Since(restStart).Round(time.Millisecond))

	all := ackedOrders(t, first, rest)
	if len(all) > units {
		t.Fatalf("oversold: %d orders acknowledged for %d units", len(all), units)
	}
	a := checkClusterLedgers(t, p, "tv", all)
	if a["sold"].(float64)+a["held"].(float64) != units {
		t.Fatalf("after sell-out: %v", a)
	}
	checkClusterLedgers(t, p, "probe", nil)
}

// TestMultiProcess_ClientThroughALeaderKill: a few hundred goroutines buy
// through one client.Client that knows one endpoint; the leader process
// is killed with SIGKILL in the middle of the sale and restarted on its
// data dir. Every call ends in a definite outcome or an error naming its
// request id, the wins the client reported are exactly the ledger's
// orders, no request id has two, and the ledgers obey the law.
func TestMultiProcess_ClientThroughALeaderKill(t *testing.T) {
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run three stockd processes")
	}
	const units, buyers, workers = 1500, 3000, 300
	p := startProcCluster(t)
	cl := clientOfCluster(t, "http://"+p.httpAddr["n1"], 3)
	if _, err := cl.CreateSale(context.Background(), "tv", client.SaleConfig{Total: units}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitSaleEverywhere(t, p, "tv")
	leader := ""
	results := buyThrough(cl.Deduct, func(int) string { return "tv" }, buyers, workers, func(b int) {
		switch b {
		case buyers / 3:
			leader = p.Leader()
			p.kill(leader)
		case 2 * buyers / 3:
			p.Start(leader)
		}
	})
	nodetest.WaitReady(t, p)
	audit := checkClusterLedgers(t, p, "tv", nil)
	reported, notDefinite := checkClientWins(t, results, ledgerOrders(t, p.Client(p.Leader()), "tv"), audit)
	t.Logf("killed %s at buyer %d, restarted it at %d: %d wins reported, %d without a definite answer, %d sold", leader, buyers/3, 2*buyers/3, len(reported), notDefinite, int(audit["sold"].(float64)))
}

// TestMultiProcess_ShardedClientOverTwoClusters: the same over two
// three-process clusters through client.NewSharded, one cluster's leader
// killed mid-sale: each SKU is sold only on its own cluster, and each
// cluster's wins are its ledger's orders.
func TestMultiProcess_ShardedClientOverTwoClusters(t *testing.T) {
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run three stockd processes")
	}
	const skus, units, buyers, workers = 6, 150, 1800, 200
	bin := buildStockd(t, t.TempDir())
	clusters := map[string]*procCluster{"east": startProcClusterOf(t, bin), "west": startProcClusterOf(t, bin)}
	var cfgs []client.Config
	for _, name := range []string{"east", "west"} {
		cfgs = append(cfgs, client.Config{Name: name, Endpoints: []string{"http://" + clusters[name].httpAddr["n1"]}, RefreshInterval: 200 * time.Millisecond})
	}
	s, err := client.NewSharded(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	skuOf := func(b int) string { return fmt.Sprintf("sku%d", b%skus) }
	for k := range skus {
		if _, err := s.CreateSale(context.Background(), skuOf(k), client.SaleConfig{Total: units}); err != nil {
			t.Fatal(err)
		}
	}
	victim := clusters[s.ClusterOf(skuOf(0))]
	leader := ""
	results := buyThrough(s.Deduct, skuOf, buyers, workers, func(b int) {
		switch b {
		case buyers / 3:
			leader = victim.Leader()
			victim.kill(leader)
		case 2 * buyers / 3:
			victim.Start(leader)
		}
	})
	for name, p := range clusters {
		nodetest.WaitReady(t, p)
		var mine []clientBuy
		for k := range skus {
			sku := skuOf(k)
			code, _ := nodetest.CallQuiet(p.Client(p.Leader()), "GET", "/v1/skus/"+sku, "")
			if own := s.ClusterOf(sku) == name; own != (code == 200) {
				t.Fatalf("%s on %s: %d (its cluster is %s)", sku, name, code, s.ClusterOf(sku))
			}
			if code != 200 {
				continue
			}
			// This SKU's buyers, in their places: checkClientWins reads
			// a buyer's request id from its index.
			part := make([]clientBuy, buyers)
			for b := k; b < buyers; b += skus {
				part[b] = results[b]
				mine = append(mine, results[b])
			}
			for b := range part {
				if b%skus != k {
					part[b] = clientBuy{err: client.ErrSoldOut} // not this SKU's: stands for nothing
				}
			}
			audit := checkClusterLedgers(t, p, sku, nil)
			checkClientWins(t, part, ledgerOrders(t, p.Client(p.Leader()), sku), audit)
		}
		t.Logf("cluster %s: %d buys checked", name, len(mine))
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
