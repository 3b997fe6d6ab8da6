package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"stockd/engine"
)

// headerClusterSecret carries -cluster-secret between nodes.
const headerClusterSecret = "X-Stockd-Cluster-Secret"

const (
	// peerStatusTimeout bounds how long GET /v1/cluster waits for a peer.
	peerStatusTimeout = 300 * time.Millisecond
	// forwardTimeout bounds a forwarded proposal: long enough for an
	// election and a commit, short enough that a buyer gets an answer.
	forwardTimeout = 10 * time.Second
	// forwardApplyWait bounds how long a follower waits to apply a
	// forwarded command itself before it answers.
	forwardApplyWait = 5 * time.Second
)

// peer checks that an internal call comes from a cluster member: the
// cluster secret when one is set, else a member's (or a loopback) address.
func (s *Server) peer(ctx *fasthttp.RequestCtx) bool {
	if s.isPeer(ctx) {
		return true
	}
	writeError(ctx, fasthttp.StatusForbidden, "forbidden", "internal routes are for cluster members")
	return false
}

func (s *Server) isPeer(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.ClusterSecret != "" {
		got := ctx.Request.Header.Peek(headerClusterSecret)
		return subtle.ConstantTimeCompare(got, []byte(s.cfg.ClusterSecret)) == 1
	}
	ip := ctx.RemoteIP()
	if ip.IsLoopback() {
		return true
	}
	hosts := map[string]bool{}
	if s.cluster != nil {
		for _, n := range s.cluster.Status().Nodes {
			if h, _, err := net.SplitHostPort(n.RaftAddr); err == nil {
				hosts[h] = true
			}
		}
	}
	for _, addr := range s.engine.NodeAddrs() {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			hosts[h] = true
		}
	}
	for h := range hosts {
		if hip := net.ParseIP(h); hip != nil && hip.Equal(ip) {
			return true
		}
		if addrs, err := net.LookupIP(h); err == nil {
			for _, a := range addrs {
				if a.Equal(ip) {
					return true
				}
			}
		}
	}
	return false
}

// adminOrPeer lets a joining node in with either credential.
func (s *Server) adminOrPeer(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.ClusterSecret != "" && s.isPeer(ctx) {
		return true
	}
	return s.admin(ctx)
}

func (s *Server) handleInternal(ctx *fasthttp.RequestCtx, route []byte) {
	switch string(route) {
	case "propose":
		if s.allow(ctx, ctx.Method(), fasthttp.MethodPost) {
			s.handlePropose(ctx)
		}
	case "status":
		if s.allow(ctx, ctx.Method(), fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, s.cluster.Status())
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such internal route")
	}
}

// handlePropose runs a command a follower forwarded. Only the leader
// proposes; anyone else answers not_leader and the follower tries again.
func (s *Server) handlePropose(ctx *fasthttp.RequestCtx) {
	var c engine.Command
	if err := json.Unmarshal(ctx.PostBody(), &c); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "malformed command: "+err.Error())
		return
	}
	if s.cluster == nil || !s.cluster.IsLeader() {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "not_leader", "this node is not the leader")
		return
	}
	res, err := s.cluster.ProposeLocal(&c)
	if err != nil {
		if errors.Is(err, engine.ErrOutcomeUnknown) {
			writeError(ctx, fasthttp.StatusGatewayTimeout, "outcome_unknown", err.Error())
			return
		}
		writeError(ctx, fasthttp.StatusServiceUnavailable, "not_leader", err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, res)
}

// joinRequest is the body of POST /v1/cluster/join.
type joinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

func (s *Server) handleJoin(ctx *fasthttp.RequestCtx) {
	var req joinRequest
	if !decodeBody(ctx, &req) {
		return
	}
	if !validID([]byte(req.ID)) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "id must be 1 to 128 letters, digits or . _ - :")
		return
	}
	if _, _, err := net.SplitHostPort(req.RaftAddr); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "raft_addr must be host:port")
		return
	}
	if !s.cluster.IsLeader() {
		s.proxyToLeader(ctx)
		return
	}
	if err := s.cluster.AddVoter(req.ID, req.RaftAddr); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"joined": req.ID, "raft_addr": req.RaftAddr})
}

func (s *Server) handleRemoveNode(ctx *fasthttp.RequestCtx, id []byte) {
	if !validID(id) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "node id must be 1 to 128 letters, digits or . _ - :")
		return
	}
	if !s.cluster.IsLeader() {
		s.proxyToLeader(ctx)
		return
	}
	if err := s.cluster.RemoveServer(string(id)); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	// The leader's janitor reclaims the leases of non-members; doing it now
	// returns the stock without waiting for the next pass.
	res, err := s.cluster.ProposeLocal(&engine.Command{Op: engine.OpReclaim, Node: string(id), AtUnixNano: time.Now().UnixNano()})
	out := map[string]any{"removed": string(id)}
	if err == nil {
		out["reclaimed_units"] = res.Qty
	} else {
		out["reclaim_error"] = err.Error()
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// proxyToLeader relays an admin request to the leader and its answer back.
func (s *Server) proxyToLeader(ctx *fasthttp.RequestCtx) {
	addr := s.leaderHTTPAddr()
	if addr == "" {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "no leader known; retry shortly")
		return
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(ctx.RequestURI()))
	if s.cfg.ClusterSecret != "" {
		req.Header.Set(headerClusterSecret, s.cfg.ClusterSecret)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := s.forwarder().client(addr).DoTimeout(req, resp, forwardTimeout); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "forward to leader: "+err.Error())
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(resp.Body())
}

func (s *Server) leaderHTTPAddr() string {
	if s.cluster == nil {
		return ""
	}
	leader := s.cluster.Status().Leader
	if leader == "" {
		return ""
	}
	return s.engine.NodeAddrs()[leader]
}

// handleCluster answers with this node's view and, for every member, what
// that member says of itself (reachable=false when it does not answer in
// time).
func (s *Server) handleCluster(ctx *fasthttp.RequestCtx) {
	if s.cluster == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "no cluster status")
		return
	}
	st := s.cluster.Status()
	addrs := s.engine.NodeAddrs()
	var wg sync.WaitGroup
	for i := range st.Nodes {
		n := &st.Nodes[i]
		n.HTTPAddr = addrs[n.ID]
		if n.ID == st.NodeID {
			n.Reachable, n.State, n.Term, n.CommitIndex, n.AppliedIndex = true, st.State, st.Term, st.CommitIndex, st.AppliedIndex
			continue
		}
		if n.HTTPAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var peer ClusterStatus
			if s.forwarder().getJSON(n.HTTPAddr, "/internal/v1/status", peerStatusTimeout, &peer) == nil {
				n.Reachable, n.State, n.Term, n.CommitIndex, n.AppliedIndex = true, peer.State, peer.Term, peer.CommitIndex, peer.AppliedIndex
			}
		}()
	}
	wg.Wait()
	writeJSON(ctx, fasthttp.StatusOK, st)
}

// Forwarder is the engine's Proposer on every node: it proposes locally on
// the leader and forwards over HTTP to the leader elsewhere, then waits
// until this node has applied the command too, so a forwarded write is
// readable here when the caller gets its answer. Safe for concurrent use.
type Forwarder struct {
	cluster Cluster
	engine  Engine
	secret  string
	dial    fasthttp.DialFunc
	logger  *slog.Logger

	mu      sync.Mutex
	clients map[string]*fasthttp.HostClient
}

func (s *Server) forwarder() *Forwarder { return s.fwd }

// Forwarder returns the server's forwarder, to pass to engine.Start.
func (s *Server) Forwarder() *Forwarder { return s.fwd }

func newForwarder(cfg Config, cluster Cluster, eng Engine, logger *slog.Logger) *Forwarder {
	return &Forwarder{
		cluster: cluster, engine: eng, secret: cfg.ClusterSecret, dial: cfg.PeerDial,
		logger: logger, clients: map[string]*fasthttp.HostClient{},
	}
}

func (f *Forwarder) client(addr string) *fasthttp.HostClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.clients[addr]
	if !ok {
		c = &fasthttp.HostClient{
			Addr: addr, Dial: f.dial, MaxConns: 64,
			ReadTimeout: forwardTimeout, WriteTimeout: forwardTimeout,
			MaxIdemponentCallAttempts: 1, // a proposal must not be sent twice by the client
		}
		f.clients[addr] = c
	}
	return c
}

// Propose implements engine.Proposer.
func (f *Forwarder) Propose(c *engine.Command) (*engine.Result, error) {
	if f.cluster.IsLeader() {
		return f.cluster.ProposeLocal(c)
	}
	leader := f.cluster.Status().Leader
	if leader == "" {
		return nil, fmt.Errorf("%w: no leader known", engine.ErrUnavailable)
	}
	addr := f.engine.NodeAddrs()[leader]
	if addr == "" {
		return nil, fmt.Errorf("%w: leader %s has not registered its http address yet", engine.ErrUnavailable, leader)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", c.Op, err)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/internal/v1/propose")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType(contentTypeJSON)
	if f.secret != "" {
		req.Header.Set(headerClusterSecret, f.secret)
	}
	req.SetBodyRaw(body)
	if err := f.client(addr).DoTimeout(req, resp, forwardTimeout); err != nil {
		if nothingSent(err) {
			return nil, fmt.Errorf("%w: forward %s to %s: %v", engine.ErrUnavailable, c.Op, leader, err)
		}
		return nil, fmt.Errorf("%w: forward %s to %s: %v", engine.ErrOutcomeUnknown, c.Op, leader, err)
	}
	switch resp.StatusCode() {
	case fasthttp.StatusOK:
	case fasthttp.StatusGatewayTimeout:
		return nil, fmt.Errorf("%w: leader %s: %s", engine.ErrOutcomeUnknown, leader, bytes.TrimSpace(resp.Body()))
	default:
		return nil, fmt.Errorf("%w: leader %s answered %d: %s", engine.ErrUnavailable, leader, resp.StatusCode(), bytes.TrimSpace(resp.Body()))
	}
	var res engine.Result
	if err := json.Unmarshal(resp.Body(), &res); err != nil {
		return nil, fmt.Errorf("%w: decode the leader's answer: %v", engine.ErrOutcomeUnknown, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), forwardApplyWait)
	defer cancel()
	if err := f.engine.WaitApplied(ctx, res.Index); err != nil {
		f.logger.Warn("forwarded command committed but not yet applied here", "op", c.Op, "err", err)
	}
	return &res, nil
}

// nothingSent reports whether a client error happened before the request
// could reach the leader.
func nothingSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrNoFreeConns)
}

func (f *Forwarder) getJSON(addr, path string, timeout time.Duration, out any) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	if f.secret != "" {
		req.Header.Set(headerClusterSecret, f.secret)
	}
	if err := f.client(addr).DoTimeout(req, resp, timeout); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("%s%s: %d", addr, path, resp.StatusCode())
	}
	return json.Unmarshal(resp.Body(), out)
}

// DialFunc dials a peer's HTTP address (fasthttp's dial hook).
type DialFunc = fasthttp.DialFunc
