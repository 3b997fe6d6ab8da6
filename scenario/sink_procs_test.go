package scenario

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/client"
	"stockd.dev/stockd/internal/dbtest"
	"stockd.dev/stockd/node/nodetest"
)

// The sink at the size of a sale, with its faults (make test-sink): three
// stockd processes, 20,000 deducts over 50 sales with holds, confirms,
// cancels and expiries; the sink SIGKILLed five times (the first between
// a database commit and its acknowledgement to stockd) and started again,
// the leader SIGKILLed once, the database stopped hard once. At the end
// reconcile exits 0, the audit trigger saw each order inserted once, and
// every node's ledger balances.

func TestMultiProcess_SinkThroughFaults_PostgreSQL(t *testing.T) {
	needMultiProc(t)
	sinkThroughFaults(t, dbtest.Postgres(t))
}

func TestMultiProcess_SinkThroughFaults_MariaDB(t *testing.T) {
	needMultiProc(t)
	sinkThroughFaults(t, dbtest.MariaDB(t))
}

// sinkProc is one `stockd sink` process, stopped through its handle.
type sinkProc struct {
	cmd    *exec.Cmd
	exited chan error
	log    string
	lines  chan string // its log, line by line
}

func (p *procCluster) targets() string {
	scheme := "http://"
	if p.sec != nil {
		scheme = "https://"
	}
	var urls []string
	for _, id := range p.ids {
		urls = append(urls, scheme+p.httpAddr[id])
	}
	return strings.Join(urls, ",")
}

func startSink(t *testing.T, p *procCluster, dsn string, n int, env ...string) *sinkProc {
	t.Helper()
	log := filepath.Join(t.TempDir(), fmt.Sprintf("sink-%d.log", n))
	cmd := exec.Command(p.bin, "sink", "-target", p.targets(), "-db", dsn, "-consumer", "shop", "-wait", "2s", "-progress", "2s")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sinkProc{cmd: cmd, exited: make(chan error, 1), log: log, lines: make(chan string, 4096)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(f, sc.Text())
			select {
			case s.lines <- sc.Text():
			default:
			}
		}
		f.Close()
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() { s.kill() })
	return s
}

func (s *sinkProc) kill() {
	if s.cmd.Process.Kill() == nil {
		<-s.exited
	}
}

// waitLine waits for a log line containing want.
func (s *sinkProc) waitLine(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-s.lines:
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			b, _ := os.ReadFile(s.log)
			t.Fatalf("the sink did not log %q in %s:\n%s", want, timeout, b)
		}
	}
}

func sinkThroughFaults(t *testing.T, db *dbtest.Server) {
	const sales, deducts, perSale, workers = 50, 20000, 300, 8
	p := startProcCluster(t)
	sql := db.DB()
	// The first sink creates the tables, then the audit trigger goes on
	// them before the first order.
	sk := startSink(t, p, db.DSN, 0, "STOCKD_SINK_TEST_ACK_DELAY=1s")
	sk.waitLine(t, "sink started", time.Minute)
	db.AddAuditTrigger(t, sql, "stockd_orders")

	cl, err := client.New(client.Config{Endpoints: strings.Split(p.targets(), ","), AttemptTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range sales {
		if _, err := cl.CreateSale(ctx, fmt.Sprintf("s%02d", i), client.SaleConfig{Total: perSale, HoldTTL: 2 * time.Second}); err != nil {
			t.Fatalf("create s%02d: %v", i, err)
		}
	}

	// Buyers in batches of 50; of each batch's wins about 40 % are
	// confirmed, 20 % cancelled, the rest left to expire.
	var sent, won atomic.Int64
	var mu sync.Mutex
	orders := map[string]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for b := w; b*50 < deducts; b += workers {
				ds := make([]client.Deduct, 50)
				for i := range ds {
					n := b*50 + i
					ds[i] = client.Deduct{SKU: fmt.Sprintf("s%02d", rng.IntN(sales)), User: fmt.Sprintf("u%d", n), RequestID: fmt.Sprintf("r%d", n)}
				}
				for _, r := range cl.DeductBatch(ctx, ds) {
					if r.Err != nil {
						if errors.Is(r.Err, client.ErrNotDefinite) {
							t.Errorf("deduct %s: %v", r.Order.RequestID, r.Err)
						}
						continue
					}
					won.Add(1)
					mu.Lock()
					orders[r.Order.OrderID] = true
					mu.Unlock()
					switch x := rng.IntN(10); {
					case x < 4:
						_, _ = cl.Confirm(ctx, r.Order.OrderID) // an expired hold answers 409: fine
					case x < 6:
						_, _ = cl.Cancel(ctx, r.Order.OrderID)
					}
				}
				sent.Add(50)
			}
		}()
	}

	// The faults, at points of the sale.
	at := func(frac float64) {
		nodetest.WaitFor(t, 3*time.Minute, fmt.Sprintf("%.0f %% of the deducts", frac*100), func() bool { return sent.Load() >= int64(frac*deducts) })
	}
	restarts := 0
	restartSink := func(env ...string) {
		restarts++
		sk = startSink(t, p, db.DSN, restarts, env...)
	}
	at(0.08)
	// 1: between a commit and its acknowledgement.
	line := sk.waitLine(t, "committed, acknowledging", time.Minute)
	sk.kill()
	_, committed, _ := strings.Cut(line, "cursor=")
	committed = strings.Fields(committed)[0]
	if acked, _, err := cl.ConsumerCursor(ctx, "shop"); err != nil || acked == committed {
		t.Fatalf("killed after committing %s: stockd's cursor is %s (%v), want it not yet acknowledged", committed, acked, err)
	}
	t.Logf("sink SIGKILLed after committing %s, before acknowledging it", committed)
	restartSink()
	for i, frac := range []float64{0.2, 0.45, 0.7, 0.9} {
		at(frac)
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // a random moment
		sk.kill()
		t.Logf("sink SIGKILLed (%d of 5) at %d deducts", i+2, sent.Load())
		restartSink()
		switch i {
		case 0:
			leader := p.Leader()
			p.kill(leader)
			t.Logf("leader %s SIGKILLed at %d deducts", leader, sent.Load())
			p.Start(leader)
		case 1:
			db.Kill()
			t.Logf("%s stopped hard at %d deducts", db.Kind, sent.Load())
			time.Sleep(time.Second) // the database stays down a while
			db.Start()
		}
	}
	wg.Wait()
	for i := range sales {
		sku := fmt.Sprintf("s%02d", i)
		nodetest.WaitFor(t, 30*time.Second, sku+"'s holds to expire", func() bool {
			s, err := cl.SKU(ctx, sku)
			return err == nil && s.Held == 0
		})
	}
	out, err := exec.Command(p.bin, "reconcile", "-target", p.targets(), "-db", db.DSN, "-wait", "2m").CombinedOutput()
	if err != nil {
		b, _ := os.ReadFile(sk.log)
		t.Fatalf("reconcile: %v\n%s\nthe sink's log:\n%s", err, out, b)
	}
	t.Logf("reconcile: %s", strings.TrimSpace(string(out)))
	// Besides the orders the buyers won, the table holds the takes the
	// ledger turned down (a node's lease cut short by the leader's death):
	// released, and no order of any buyer's.
	rows := db.CheckInsertedOnce(t, sql, "stockd_orders")
	var turnedDown int
	if err := sql.QueryRow("SELECT COUNT(*) FROM stockd_orders WHERE state = 'released' AND release_reason LIKE 'turned_down_%'").Scan(&turnedDown); err != nil {
		t.Fatal(err)
	}
	if rows != len(orders)+turnedDown {
		t.Fatalf("the table holds %d rows, %d of them turned down; the buyers won %d orders", rows, turnedDown, len(orders))
	}
	for _, id := range p.ids {
		for i := range sales {
			nodetest.CheckLedger(t, p.Client(id), fmt.Sprintf("s%02d", i))
		}
	}
	t.Logf("%d deducts, %d orders, %d sink restarts, all in %s once", sent.Load(), won.Load(), restarts, db.Kind)
}

// TestMultiProcess_SinkOverTLSWithClientCertificates: nodes on HTTPS that
// require client certificates; the sink and reconcile with -ca, -cert
// and -key write and check every order, and without the certificate the
// sink stops saying why.
func TestMultiProcess_SinkOverTLSWithClientCertificates(t *testing.T) {
	needMultiProc(t)
	db := dbtest.Postgres(t)
	p, sec, bin := secureCluster(t, func(t *testing.T, bin string, sec *procSecurity) { sec.clientCA = true })
	leader := p.Client(p.Leader())
	if code, body := nodetest.Call(t, leader, "PUT", "/v1/skus/tls", `{"total":100}`); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, p, "tls")
	for i := range 50 {
		if code, body := nodetest.Call(t, p.Client(p.ids[i%3]), "POST", "/v1/skus/tls/deduct", fmt.Sprintf(`{"user":"u%d"}`, i)); code != 200 {
			t.Fatalf("deduct %d: %d %v", i, code, body)
		}
	}
	tlsArgs := []string{"-ca", filepath.Join(sec.dir, "ca.pem"), "-cert", filepath.Join(sec.dir, "client.pem"), "-key", filepath.Join(sec.dir, "client-key.pem")}
	common := []string{"-target", p.targets(), "-db", db.DSN}
	out, err := exec.Command(bin, append(append([]string{"sink", "-consumer", "shop", "-wait", "0s", "-exit-when-idle"}, common...), tlsArgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("stockd sink over TLS: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, append(append([]string{"reconcile", "-wait", "10s"}, common...), tlsArgs...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "50 orders in 1 sales agree") {
		t.Fatalf("stockd reconcile over TLS: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, append(append([]string{"sink", "-consumer", "shop", "-wait", "0s", "-exit-when-idle"}, common...), tlsArgs[:2]...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "client_certificate_required") {
		t.Fatalf("the sink without its client certificate: %v\n%s", err, out)
	}
}
