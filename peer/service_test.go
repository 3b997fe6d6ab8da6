package peer

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// countingProposals counts forwarded commands that got past the checks.
type countingProposals struct{ n int }

func (p *countingProposals) HandleForwarded(from string, _ []byte) (int, []byte) {
	p.n++
	return fasthttp.StatusOK, []byte(from)
}

type fakeNode struct{}

func (fakeNode) Status() any { return map[string]string{"node_id": "n1"} }

// LeaderReadIndex answers 42 on a quorum round, 43 on the lease.
func (fakeNode) LeaderReadIndex(_ context.Context, lease bool) (uint64, error) {
	if lease {
		return 43, nil
	}
	return 42, nil
}

// certConn is a node-port connection whose certificate named id.
type certConn struct {
	net.Conn
	id string
}

func (c certConn) PeerID() string { return c.id }

func newCtx(method, path string, conn net.Conn, headers ...string) *fasthttp.RequestCtx {
	ctx := &fasthttp.RequestCtx{}
	if conn != nil {
		ctx.Init2(conn, nil, false)
	} else {
		ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 7001}, nil)
	}
	req := &ctx.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	req.SetBodyString("command")
	return ctx
}

// TestService_RefusesWhatIsNotAPeerOfThisCluster: the internal routes
// serve only another node of this cluster (the cluster secret, or a node
// certificate on the node port, in its own name), and a propose only in
// the wire's version; a refused call reaches no proposal.
func TestService_RefusesWhatIsNotAPeerOfThisCluster(t *testing.T) {
	f := func(name string, cfg ServiceConfig, ctx *fasthttp.RequestCtx, want int) {
		t.Helper()
		p := &countingProposals{}
		cfg.Node, cfg.Proposals = fakeNode{}, p
		NewService(cfg).Handle(ctx)
		got := ctx.Response.StatusCode()
		if got != want || (p.n == 1) != (want == 200) {
			t.Errorf("%s: %d (%d proposals), want %d: %s", name, got, p.n, want, ctx.Response.Body())
		}
	}
	secret := ServiceConfig{Secret: "s"}
	wire := []string{headerWireVersion, WireVersion}
	with := func(h ...string) []string { return append(append([]string(nil), wire...), h...) }
	f("no secret configured", ServiceConfig{}, newCtx("POST", routePropose, nil, with(headerSecret, "s")...), 404)
	f("no secret sent", secret, newCtx("POST", routePropose, nil, wire...), 403)
	f("a wrong secret", secret, newCtx("POST", routePropose, nil, with(headerSecret, "x")...), 403)
	f("the secret", secret, newCtx("POST", routePropose, nil, with(headerSecret, "s")...), 200)
	f("another wire version", secret, newCtx("POST", routePropose, nil, headerSecret, "s", headerWireVersion, "0"), 400)
	f("a GET of propose", secret, newCtx("GET", routePropose, nil, with(headerSecret, "s")...), 405)
	f("an unknown route", secret, newCtx("GET", RoutePrefix+"nope", nil, with(headerSecret, "s")...), 404)
	restored := ServiceConfig{Secret: "s", ClusterID: func() string { return "c2" }}
	f("another cluster's call", restored, newCtx("POST", routePropose, nil, with(headerSecret, "s", headerCluster, "c1")...), 403)
	f("this cluster's call", restored, newCtx("POST", routePropose, nil, with(headerSecret, "s", headerCluster, "c2")...), 200)
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	tls := ServiceConfig{TLS: true}
	f("node certificates, not the node port", tls, newCtx("POST", routePropose, nil, with(headerSecret, "s")...), 404)
	f("node certificates, the node port", tls, newCtx("POST", routePropose, certConn{server, "n2"}, with(headerNode, "n2")...), 200)
	f("node certificates, another node's name", tls, newCtx("POST", routePropose, certConn{server, "n2"}, with(headerNode, "n3")...), 403)
}

// TestService_ProposalsHearTheCallersName: the propose route hands on
// the name the certificate gives, or the one the secret's caller gives.
func TestService_ProposalsHearTheCallersName(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	for _, c := range []struct {
		cfg  ServiceConfig
		ctx  *fasthttp.RequestCtx
		want string
	}{
		{ServiceConfig{Secret: "s"}, newCtx("POST", routePropose, nil, headerWireVersion, WireVersion, headerSecret, "s", headerNode, "n7"), "n7"},
		{ServiceConfig{TLS: true}, newCtx("POST", routePropose, certConn{server, "n2"}, headerWireVersion, WireVersion), "n2"},
	} {
		c.cfg.Node, c.cfg.Proposals = fakeNode{}, &countingProposals{}
		NewService(c.cfg).Handle(c.ctx)
		if got := string(c.ctx.Response.Body()); got != c.want {
			t.Errorf("%+v: proposals heard %q, want %q", c.cfg, got, c.want)
		}
	}
}

// TestService_StatusAndReadIndex answer a peer with the node's own.
func TestService_StatusAndReadIndex(t *testing.T) {
	s := NewService(ServiceConfig{Secret: "s", Node: fakeNode{}})
	for path, want := range map[string]string{
		routeStatus:                     `{"node_id":"n1"}` + "\n",
		routeReadIndex:                  `{"index":42}` + "\n",
		routeReadIndex + "?" + argLease: `{"index":43}` + "\n",
	} {
		ctx := newCtx("GET", path, nil, headerSecret, "s")
		s.Handle(ctx)
		if got := fmt.Sprintf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body()); got != "200 "+want {
			t.Errorf("%s: %s, want 200 %s", path, got, want)
		}
	}
}
