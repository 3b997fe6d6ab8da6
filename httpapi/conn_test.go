package httpapi

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/internal/coarsedeadline"
)

// startConnTestServer serves a server with short timeouts on loopback,
// on a listener of coarse deadlines as a node's, swept every 20 ms so
// that the timeouts go through the sweeper.
func startConnTestServer(t *testing.T) string {
	t.Helper()
	fe := &fakeEngine{}
	cfg := DefaultConfig()
	cfg.ReadTimeout, cfg.IdleTimeout = 200*time.Millisecond, 200*time.Millisecond
	cfg.ListenerTimeouts = true
	// The internal routes answer with the body's length.
	cfg.InternalMaxBodyBytes = 1 << 20
	cfg.Internal = func(ctx *fasthttp.RequestCtx) { writeJSON(ctx, 200, map[string]int{"bytes": len(ctx.PostBody())}) }
	s, err := New(cfg, fe, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln = coarsedeadline.Wrap(ln, 20*time.Millisecond).Enforce(coarsedeadline.Timeouts{
		Read: cfg.ReadTimeout, Write: cfg.WriteTimeout, Idle: cfg.IdleTimeout})
	s.Serve(ln)
	t.Cleanup(func() { s.Shutdown(t.Context()) })
	return addr
}

// readUntilClosed reads what the server sends until it closes the
// connection (bounded by a deadline far past the server's timeouts).
func readUntilClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read until the server closes: %v (got %q)", err, b)
	}
	return string(b)
}

func TestServer_ConnectionThatSendsNothingIsClosedWithoutAnAnswer(t *testing.T) {
	addr := startConnTestServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := readUntilClosed(t, c); got != "" {
		t.Fatalf("server wrote %q to a connection that sent nothing, want a quiet close", got)
	}
}

func TestServer_IdleKeepAliveIsClosedWithoutAnAnswer(t *testing.T) {
	addr := startConnTestServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	// Now idle past IdleTimeout: the next thing on the wire must be the
	// close, not an unsolicited response.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read until the server closes: %v", err)
	}
	if len(rest) != 0 {
		t.Fatalf("server wrote %q on an idle keep-alive connection, want a quiet close", rest)
	}
}

func TestServer_MalformedRequestStillGets400(t *testing.T) {
	addr := startConnTestServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "NOT HTTP AT ALL\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, "malformed") {
		t.Fatalf("malformed request got %q, want a 400", got)
	}
}

func TestServer_InternalRoutesTakeBodiesOverThePublicCap(t *testing.T) {
	addr := startConnTestServer(t)
	body := strings.Repeat("x", MaxBodyBytes+1)
	post := func(path string) int {
		t.Helper()
		resp, err := http.Post("http://"+addr+path, "application/octet-stream", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/v1/skus/a/deduct"); code != 413 {
		t.Fatalf("public route with %d bytes: %d, want 413", len(body), code)
	}
	if code := post("/internal/v1/propose"); code != 200 {
		t.Fatalf("internal route with %d bytes: %d, want 200 (its own cap is %d)", len(body), code, 1<<20)
	}
}
