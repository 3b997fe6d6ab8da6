package scenario

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"stockd.dev/stockd/node/nodetest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The memory test fills one stockd process with a million sold orders,
// each with its request id, and reads the process's peak resident memory
// (VmHWM, mapped pages of ledger.db and the raft log included). Then it
// closes and archives the sale and reads memory and ledger.db again. It
// has its own target:
//
//	make test-memory   (STOCKD_MEMORY=1 go test -run Memory .)

const (
	memoryOrders    = 1_000_000
	memoryConns     = 64
	memoryHWMMaxKiB = 384 << 10 // 384 MiB
)

// procKiB reads one "Name: N kB" line of /proc/<pid>/status.
func procKiB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

func TestMemory_AMillionOrdersWithRequestIDs(t *testing.T) {
	if os.Getenv("STOCKD_MEMORY") == "" {
		t.Skip("set STOCKD_MEMORY=1 (make test-memory) to fill one node with a million orders and read its peak memory")
	}
	dir := t.TempDir()
	bin := buildStockd(t, dir)
	httpAddr, raftAddr := freePort(t), freePort(t)
	logFile, err := os.Create(filepath.Join(dir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "serve", "-http", httpAddr, "-raft", raftAddr, "-data", filepath.Join(dir, "data"), "-log-level", "warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}()
	c := &fasthttp.HostClient{Addr: httpAddr, MaxConns: memoryConns + 4, ReadTimeout: 30 * time.Second}
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("--- last %d lines of the node's log:\n%s", logTailsLines, strings.Join(lines[max(0, len(lines)-logTailsLines):], "\n"))
		}
	}()
	nodetest.WaitFor(t, time.Minute, "the node ready", func() bool {
		select {
		case err := <-exited:
			exited <- err // for the deferred stop
			t.Fatalf("the node exited before it was ready: %v", err)
		default:
		}
		code, _ := nodetest.CallQuiet(c, "GET", "/readyz", "")
		return code == 200
	})
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/mem", fmt.Sprintf(`{"total":%d}`, memoryOrders)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}

	// A million buyers, each with a request id, as fast as the node
	// accepts them (wait=none: 202, or 200 when the commit was quicker
	// than the answer; every order is committed below).
	start := time.Now()
	var next, failed, limited atomic.Int64
	var wg sync.WaitGroup
	for range memoryConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for {
				b := next.Add(1) - 1
				if b >= memoryOrders || time.Since(start) > 5*time.Minute {
					return
				}
				// A 429 (the node's admission following its ledger: the
				// commits fell behind) is honoured like a client would,
				// a bounded number of times.
				for attempt := 0; ; attempt++ {
					req.Reset()
					req.SetRequestURI("http://" + httpAddr + "/v1/skus/mem/deduct?wait=none")
					req.Header.SetMethod("POST")
					req.SetBody(fmt.Appendf(nil, `{"user":"user-%d","request_id":"request-%d"}`, b, b))
					err := c.DoTimeout(req, resp, 30*time.Second)
					if err == nil && resp.StatusCode() == 429 && attempt < 60 {
						limited.Add(1)
						time.Sleep(retryAfter(resp)) // honouring Retry-After, not synchronising
						continue
					}
					if err != nil || (resp.StatusCode() != 202 && resp.StatusCode() != 200) {
						if failed.Add(1) <= 3 {
							t.Errorf("deduct %d: %v %d %s", b, err, resp.StatusCode(), resp.Body())
						}
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d deducts failed", failed.Load())
	}
	var sku map[string]any
	nodetest.WaitFor(t, 2*time.Minute, "every order committed", func() bool {
		_, sku = nodetest.CallQuiet(c, "GET", "/v1/skus/mem", "")
		return sku != nil && sku["sold"].(float64) == memoryOrders
	})
	filled := time.Since(start)
	if n := limited.Load(); n > 0 {
		t.Logf("%d answers were 429 (admission following the ledger) and were retried", n)
	}

	// Repeats of the first and the last request id answer their orders.
	for _, b := range []int{0, memoryOrders - 1} {
		code, out := nodetest.Call(t, c, "POST", "/v1/skus/mem/deduct", fmt.Sprintf(`{"user":"user-%d","request_id":"request-%d"}`, b, b))
		if code != 200 || out["order_id"] == nil {
			t.Fatalf("repeat of request-%d: %d %v", b, code, out)
		}
	}
	nodetest.CheckLedger(t, c, "mem")
	pid := cmd.Process.Pid
	hwm, rss := procKiB(t, pid, "VmHWM"), procKiB(t, pid, "VmRSS")
	anon, file := procKiB(t, pid, "RssAnon"), procKiB(t, pid, "RssFile")
	ledger, _ := os.Stat(filepath.Join(dir, "data", "ledger.db"))
	t.Logf("%d orders with request ids in %s; peak resident %d MiB (now %d MiB: %d anonymous, %d file-backed); ledger.db %d MiB",
		memoryOrders, filled.Round(time.Second), hwm>>10, rss>>10, anon>>10, file>>10, ledger.Size()>>20)
	if hwm > memoryHWMMaxKiB {
		t.Fatalf("peak resident memory %d MiB, the most allowed is %d MiB", hwm>>10, memoryHWMMaxKiB>>10)
	}

	// The sale ends: closed, then archived. Its orders leave the ledger,
	// the file is compacted, memory is given back; the totals stay. The
	// file keeps the sale's million feed events (until -event-retention),
	// about half of it now that orders are stored in blocks: compacted, it
	// is at most 60 % of what it was.
	if code, out := nodetest.Call(t, c, "POST", "/v1/skus/mem/close", ""); code != 200 {
		t.Fatalf("close: %d %v", code, out)
	}
	archived := time.Now()
	if code, out := nodetest.Call(t, c, "POST", "/v1/skus/mem/archive", ""); code != 200 {
		t.Fatalf("archive: %d %v", code, out)
	}
	var after map[string]any
	var size int64
	defer func() {
		if t.Failed() {
			t.Logf("at the end: the sale %v; ledger.db %d MiB", after, size>>20)
		}
	}()
	nodetest.WaitFor(t, 5*time.Minute, "the archived orders out and the file compacted", func() bool {
		_, after = nodetest.CallQuiet(c, "GET", "/v1/skus/mem", "")
		st, err := os.Stat(filepath.Join(dir, "data", "ledger.db"))
		if err == nil {
			size = st.Size()
		}
		return after != nil && after["archive_done"] == true && err == nil && size < ledger.Size()*3/5
	})
	took := time.Since(archived)
	if after["total"] != sku["total"] || after["sold"] != sku["sold"] || after["archived_orders"] != float64(memoryOrders) {
		t.Fatalf("the archived sale %v; before %v", after, sku)
	}
	nodetest.CheckLedger(t, c, "mem")
	// Memory goes back to the system in the background: wait for it, then
	// read it.
	var rssAfter int64
	deadline := time.Now().Add(time.Minute)
	for rssAfter = procKiB(t, pid, "VmRSS"); rssAfter >= rss*3/5; rssAfter = procKiB(t, pid, "VmRSS") {
		if time.Now().After(deadline) {
			_, heap := callRaw(c, "/debug/pprof/heap?debug=1")
			var stats []string
			for _, line := range strings.Split(heap, "\n") {
				if strings.HasPrefix(line, "# Heap") || strings.HasPrefix(line, "# Sys") || strings.HasPrefix(line, "# Stack") || strings.HasPrefix(line, "# MSpan") || strings.HasPrefix(line, "# GCSys") || strings.HasPrefix(line, "# OtherSys") {
					stats = append(stats, strings.TrimPrefix(line, "# "))
				}
			}
			t.Fatalf("resident memory %d MiB (%d anonymous, %d file-backed) a minute after the archive, %d MiB before it: not below 60 %% of it; Go's memory: %s",
				rssAfter>>10, procKiB(t, pid, "RssAnon")>>10, procKiB(t, pid, "RssFile")>>10, rss>>10, strings.Join(stats, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	ledgerAfter, _ := os.Stat(filepath.Join(dir, "data", "ledger.db"))
	t.Logf("archived %d orders in %s: resident %d MiB -> %d MiB (%d anonymous, %d file-backed); ledger.db %d MiB -> %d MiB; total %v and sold %v unchanged",
		memoryOrders, took.Round(time.Millisecond), rss>>10, rssAfter>>10, procKiB(t, pid, "RssAnon")>>10, procKiB(t, pid, "RssFile")>>10,
		ledger.Size()>>20, ledgerAfter.Size()>>20, after["total"], after["sold"])
	if code, _ := nodetest.Call(t, c, "POST", "/v1/skus/mem/deduct", `{"user":"user-0","request_id":"request-0"}`); code != 409 {
		t.Fatalf("a repeat after the archive: %d, want 409 closed", code)
	}
}

// callRaw is a GET returning the body as text.
func callRaw(c *fasthttp.HostClient, path string) (int, string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, path))
	if err := c.DoTimeout(req, resp, 30*time.Second); err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode(), string(resp.Body())
}

// retryAfter is a 429's Retry-After, at most two seconds.
func retryAfter(resp *fasthttp.Response) time.Duration {
	secs, err := strconv.Atoi(string(resp.Header.Peek("Retry-After")))
	if err != nil || secs < 1 {
		secs = 1
	}
	return min(time.Duration(secs)*time.Second, 2*time.Second)
}
