package peer

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// heldPeer is a peer whose every call waits in its handler until release
// closes; held counts the calls waiting there.
func heldPeer(t *testing.T) (c *Client, held *atomic.Int64, release chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held, release = &atomic.Int64{}, make(chan struct{})
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		held.Add(1)
		<-release
		ctx.SetStatusCode(fasthttp.StatusOK)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	addr := ln.Addr().String()
	return NewClient(ClientConfig{Self: "n2", Resolve: func(string) string { return addr }}), held, release
}

func call(c *Client) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/internal/status")
	return c.Do("n1", req, resp, 10*time.Second)
}

func waitHeld(t *testing.T, held *atomic.Int64, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); held.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls reached the peer, want %d", held.Load(), n)
		}
	}
}

// TestClient_ABurstAboveThePoolWaitsForAConnection: more calls at once
// than connections to a peer all get through once the first ones end (a
// burst of relayed confirms failed with 503 "no free connections").
func TestClient_ABurstAboveThePoolWaitsForAConnection(t *testing.T) {
	c, held, release := heldPeer(t)
	const extra = 5
	errs := make(chan error, connsMax+extra)
	var wg sync.WaitGroup
	for range connsMax + extra {
		wg.Go(func() { errs <- call(c) })
	}
	waitHeld(t, held, connsMax)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call beyond the pool failed: %v", err)
		}
	}
	if got := held.Load(); got != connsMax+extra {
		t.Fatalf("%d calls reached the peer, want %d", got, connsMax+extra)
	}
}

// TestClient_NoConnectionInTimeIsNotSent: a call that waited its time for
// a connection and got none fails as not sent (the caller may send it
// again), not as a call that may have reached the peer.
func TestClient_NoConnectionInTimeIsNotSent(t *testing.T) {
	c, held, release := heldPeer(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release) // before the wait: the held calls end
	for range connsMax {
		wg.Go(func() { call(c) })
	}
	waitHeld(t, held, connsMax)
	err := call(c)
	if err == nil || !c.NotSent(err) {
		t.Fatalf("a call with no connection free: err %v, NotSent %v", err, err != nil && c.NotSent(err))
	}
}
