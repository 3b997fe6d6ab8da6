package scenario

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"

	"github.com/valyala/fasthttp"
)

// benchConns is the client concurrency of the HTTP benchmarks: 32 goroutines
// per core on this 2-core machine gives 64 connections, the harness default.
const benchParallelism = 32

// noopNsPerOp is the no-op handler's cost measured in this run, the baseline
// the deduct variants report their ratio against.
var noopNsPerOp atomic.Int64

// BenchmarkHTTP measures deducts over real loopback HTTP against a fasthttp
// handler that does nothing, in the same run. Run it with
//
//	go test -run XXX -bench BenchmarkHTTP -benchtime 3s ./scenario
//
// noop must run first (sub-benchmarks run in order) for the x_noop ratios.
func BenchmarkHTTP(b *testing.B) {
	b.Run("noop", benchNoop)
	b.Run("deduct-sold-out", func(b *testing.B) { benchDeduct(b, 0, "") })
	b.Run("deduct-commit", func(b *testing.B) { benchDeduct(b, 1<<40, "") })
	b.Run("deduct-wait-none", func(b *testing.B) { benchDeduct(b, 1<<40, "?wait=none") })
}

func benchNoop(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"error":"sold_out","detail":"no units left"}` + "\n")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(409)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	runHTTPBench(b, ln.Addr().String(), "/v1/skus/x/deduct")
	noopNsPerOp.Store(int64(b.Elapsed()) / int64(max(b.N, 1)))
}

func benchDeduct(b *testing.B, units int64, query string) {
	cfg := nodetest.NodeConfig(b, "n1", b.TempDir(), 200*time.Millisecond)
	cfg.Engine.BucketsPerSKU = 16
	n, err := node.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Stop(context.Background())
	c := nodetest.ClientOf(n, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := nodetest.CallQuiet(c, "GET", "/readyz", ""); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("node not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		code, _ := nodetest.Call(b, c, "PUT", "/v1/skus/bench", fmt.Sprintf(`{"total":%d}`, units))
		if code == 201 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("create sale: %d", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if units == 0 {
		// One deduct finds out the sale is sold out and sets the flag.
		nodetest.Call(b, c, "POST", "/v1/skus/bench/deduct", `{"user":"first"}`)
	}
	runHTTPBench(b, n.HTTPAddr(), "/v1/skus/bench/deduct"+query)
	if base := noopNsPerOp.Load(); base > 0 {
		b.ReportMetric(float64(base)/(float64(b.Elapsed())/float64(b.N)), "x_noop")
	}
	if units > 0 {
		a := checkLedgerTB(b, c, "bench")
		b.ReportMetric(a, "sold")
	}
}

func runHTTPBench(b *testing.B, addr, path string) {
	client := &fasthttp.HostClient{Addr: addr, MaxConns: 2 * benchParallelism * 2, ReadTimeout: 30 * time.Second}
	var seq atomic.Uint64
	var failures atomic.Uint64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + path)
		req.Header.SetMethod("POST")
		var body []byte
		for pb.Next() {
			i := seq.Add(1)
			body = fmt.Appendf(body[:0], `{"user":"u%d","qty":1,"request_id":"b%d"}`, i, i)
			req.SetBodyRaw(body)
			if err := client.Do(req, resp); err != nil {
				failures.Add(1)
				continue
			}
			if c := resp.StatusCode(); c != 200 && c != 202 && c != 409 {
				failures.Add(1)
			}
		}
	})
	b.StopTimer()
	if f := failures.Load(); f > 0 {
		b.Fatalf("%d of %d requests failed", f, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// checkLedgerTB audits over HTTP and returns sold+held; it fails the
// benchmark on a broken conservation law.
func checkLedgerTB(b *testing.B, c *fasthttp.HostClient, sku string) float64 {
	code, a := nodetest.Call(b, c, "GET", "/v1/skus/"+sku+"/audit", "")
	if code != 200 || a["ok"] != true {
		b.Fatalf("audit %s: %d %v", sku, code, a)
	}
	return a["sold"].(float64) + a["held"].(float64)
}
