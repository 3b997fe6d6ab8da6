package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	// peerStatusTimeout bounds how long GET /v1/cluster waits for a peer.
	peerStatusTimeout = 300 * time.Millisecond
	// proxyTimeout bounds an admin call relayed to the leader: long enough
	// for an election and a commit.
	proxyTimeout = 10 * time.Second
	// peerConnsMax bounds the connections this node opens to one peer.
	peerConnsMax = 64
	// relayApplyWait bounds how long a relayed call waits for this node
	// to apply what the leader applied.
	relayApplyWait = 5 * time.Second
)

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
	case "read-index":
		if s.allow(ctx, ctx.Method(), fasthttp.MethodGet) {
			s.handleReadIndex(ctx)
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such internal route")
	}
}

// readIndexWait bounds the leader's confirmation of a read index.
const readIndexWait = time.Second

// ReadIndexJSON is GET /internal/v1/read-index's answer: an index every
// write the cluster acknowledged before the call has reached (leader
// only; raftnode.Node.ReadIndex).
type ReadIndexJSON struct {
	Index uint64 `json:"index"`
}

func (s *Server) handleReadIndex(ctx *fasthttp.RequestCtx) {
	wait, cancel := context.WithTimeout(context.Background(), readIndexWait)
	defer cancel()
	index, err := s.cluster.LeaderReadIndex(wait)
	if err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, ReadIndexJSON{Index: index})
}

// Internal wire of POST /internal/v1/propose (docs/architecture.md, "Forwarding
// inside the cluster"): the body is one command in the ledger's binary
// encoding, the answer one encoded result. InternalMaxBodyBytes is its own
// cap, far above the largest Take batch, and independent of the public
// MaxBodyBytes.
const (
	// InternalMaxBodyBytes bounds one forwarded command.
	InternalMaxBodyBytes = 4 << 20
	// InternalWireVersion is sent in headerWireVersion; a node refuses a
	// version it does not speak (400), so mixed versions fail loudly.
	InternalWireVersion = "1"
	headerWireVersion   = "X-Stockd-Wire"
	contentTypeCommand  = "application/x-stockd-command"
)

// Statuses of the internal propose route beside 200 (the encoded result).
const (
	// ProposeNotLeader: this node does not lead; nothing was proposed.
	ProposeNotLeader = fasthttp.StatusMisdirectedRequest
	// ProposeUnavailable: the leader could not queue the command; nothing
	// was proposed.
	ProposeUnavailable = fasthttp.StatusServiceUnavailable
	// ProposeOutcomeUnknown: the command entered the log; it may commit.
	ProposeOutcomeUnknown = fasthttp.StatusGatewayTimeout
	// ProposeMalformed, ProposeForbidden and ProposeTooLarge: refused for
	// good (forbidden: not a command a peer may send, such as a Take in
	// another node's name).
	ProposeMalformed = fasthttp.StatusBadRequest
	ProposeForbidden = fasthttp.StatusForbidden
	ProposeTooLarge  = fasthttp.StatusRequestEntityTooLarge
)

// Proposals is the leader's side of the internal wire: it decodes,
// checks and proposes one command that node fromNode forwarded, and
// returns the status and answer to send back. The body is only valid
// during the call.
type Proposals interface {
	HandleForwarded(fromNode string, body []byte) (status int, answer []byte)
}

func (s *Server) handlePropose(ctx *fasthttp.RequestCtx) {
	if string(ctx.Request.Header.Peek(headerWireVersion)) != InternalWireVersion {
		writeError(ctx, ProposeMalformed, "bad_request", "internal wire version "+strconv.Quote(string(ctx.Request.Header.Peek(headerWireVersion)))+" not spoken here (want "+InternalWireVersion+")")
		return
	}
	if s.cfg.Proposals == nil {
		writeError(ctx, ProposeUnavailable, "unavailable", "this node takes no forwarded commands")
		return
	}
	from := s.peerName(ctx)
	status, answer := s.cfg.Proposals.HandleForwarded(from, ctx.PostBody())
	if status == ProposeForbidden {
		s.logger.Warn("refused a forwarded command", "peer", from, "peer_addr", ctx.RemoteAddr().String(), "why", string(bytes.TrimSpace(answer)))
	}
	ctx.SetStatusCode(status)
	if status == fasthttp.StatusOK {
		ctx.SetContentType(contentTypeCommand)
	} else {
		ctx.SetContentType(contentTypeJSON)
	}
	ctx.SetBody(answer)
}

// joinRequest is the body of POST /v1/cluster/join.
type joinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	// Cluster and AppliedIndex are the joiner's ledger's: a node that
	// holds another cluster's state may not join.
	Cluster      string `json:"cluster,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
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
	if own := s.clusterID(); own != "" && req.Cluster != own && (req.Cluster != "" || req.AppliedIndex > 0) {
		s.logger.Warn("refused a join from a node of another cluster", "peer", req.ID, "peer_addr", ctx.RemoteAddr().String(), "its_cluster", req.Cluster, "its_applied_index", req.AppliedIndex, "cluster", own)
		writeError(ctx, fasthttp.StatusConflict, "other_cluster", fmt.Sprintf("node %s holds the state of another cluster (%q at index %d); this cluster is %s: join it with an empty data dir", req.ID, req.Cluster, req.AppliedIndex, own))
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
	units, err := s.engine.Reclaim(string(id))
	out := map[string]any{"removed": string(id)}
	if err == nil {
		out["reclaimed_units"] = units
	} else {
		out["reclaim_error"] = err.Error()
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// relayed sends a state-changing call to the leader when this node does
// not lead, and reports whether it did (the answer is then written). The
// caller has checked the credential here; the leader checks it again.
func (s *Server) relayed(ctx *fasthttp.RequestCtx) bool {
	if s.cluster == nil || s.cluster.IsLeader() {
		return false
	}
	s.proxyToLeader(ctx)
	return true
}

// proxyToLeader relays a request to the leader with the caller's own
// headers (its Authorization above all) and the answer back: 503 when the
// relay surely did not reach the leader, 504 outcome_unknown when it may
// have. After a success it waits, bounded, until this node has applied what the leader
// had, so the caller reads its write here too.
func (s *Server) proxyToLeader(ctx *fasthttp.RequestCtx) {
	leader := s.leaderID()
	if leader == "" {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "no leader known; retry shortly")
		return
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.CopyTo(req)
	req.SetRequestURIBytes(ctx.RequestURI())
	req.Header.Del(headerRelayedLoopback)
	if ctx.RemoteIP().IsLoopback() {
		req.Header.Set(headerRelayedLoopback, "1")
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := s.peers.do(leader, req, resp, proxyTimeout); err != nil {
		if nothingSent(err) {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "relay to the leader: "+err.Error())
			return
		}
		// The leader may have applied the call and its answer got lost:
		// saying 503 here would tell the caller that nothing happened.
		writeError(ctx, fasthttp.StatusGatewayTimeout, "outcome_unknown", "relay to the leader failed after sending; the call may have been applied, retry it: "+err.Error())
		return
	}
	if index, err := strconv.ParseUint(string(resp.Header.Peek(headerAppliedIndex)), 10, 64); err == nil && resp.StatusCode() < 300 {
		wait, cancel := context.WithTimeout(context.Background(), relayApplyWait)
		if err := s.engine.WaitApplied(wait, index); err != nil {
			s.logger.Warn("relayed call applied on the leader, not yet here", "path", string(ctx.Path()), "index", index, "err", err)
		}
		cancel()
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(resp.Body())
}

// markApplied tells a relaying peer which index to wait for.
func (s *Server) markApplied(ctx *fasthttp.RequestCtx) {
	if len(ctx.Request.Header.Peek(headerPeerNode)) > 0 {
		ctx.Response.Header.Set(headerAppliedIndex, strconv.FormatUint(s.engine.AppliedIndex(), 10))
	}
}

func (s *Server) leaderID() string {
	if s.cluster == nil {
		return ""
	}
	return s.cluster.Status().Leader
}

// handleCluster answers with this node's view and, for every member, what
// that member says of itself (reachable=false when it does not answer in
// time).
func (s *Server) handleCluster(ctx *fasthttp.RequestCtx) {
	if s.cluster == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "no cluster status")
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, s.clusterStatus())
}

// clusterStatus is this node's view of the cluster, each peer's own state
// asked of it (bounded by peerStatusTimeout).
func (s *Server) clusterStatus() ClusterStatus {
	st := s.cluster.Status()
	addrs := s.engine.NodeAddrs()
	var wg sync.WaitGroup
	for i := range st.Nodes {
		n := &st.Nodes[i]
		n.HTTPAddr = addrs[n.ID]
		if n.ID == st.NodeID {
			n.Reachable, n.State, n.Term, n.CommitIndex, n.AppliedIndex = true, st.State, st.Term, st.CommitIndex, st.AppliedIndex
			n.RulesKnown = st.RulesKnown
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var peer ClusterStatus
			if s.peers.GetJSON(n.ID, "/internal/v1/status", peerStatusTimeout, &peer) == nil {
				n.Reachable, n.State, n.Term, n.CommitIndex, n.AppliedIndex = true, peer.State, peer.Term, peer.CommitIndex, peer.AppliedIndex
				n.RulesKnown = peer.RulesKnown
			}
		}()
	}
	wg.Wait()
	return st
}

// PeerClient carries node-to-node calls: forwarded commands, status
// probes, relayed admin calls. Calls name the node they go to; the client
// resolves its address (the HTTP address it registered in the ledger, or
// its node port when the cluster runs on node certificates), keeps a
// small connection pool per address and adds this node's credentials.
// Safe for concurrent use.
type PeerClient struct {
	cfg PeerClientConfig

	mu      sync.Mutex
	clients map[string]*fasthttp.HostClient
}

// PeerClientConfig says how a node reaches its peers.
type PeerClientConfig struct {
	// Self is this node's id, sent with every call.
	Self string
	// Secret is the cluster secret, sent with every call (empty on a
	// cluster of node certificates: the connection itself proves who
	// calls).
	Secret string
	// Resolve gives the address a node's calls go to ("" while unknown).
	Resolve func(id string) string
	// Dial connects to an address (nil: plain TCP).
	Dial DialFunc
	// Cluster is this node's cluster identity, sent with every call when
	// it has one (nil or "": none).
	Cluster func() string
}

// NewPeerClient returns a client as cfg says.
func NewPeerClient(cfg PeerClientConfig) *PeerClient {
	if cfg.Resolve == nil {
		cfg.Resolve = func(string) string { return "" }
	}
	return &PeerClient{cfg: cfg, clients: map[string]*fasthttp.HostClient{}}
}

// do sends req (its URI a path) to node id with this node's credentials.
func (c *PeerClient) do(id string, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	addr := c.cfg.Resolve(id)
	if addr == "" {
		return fmt.Errorf("%w: no address known for node %s", ErrNotSent, id)
	}
	req.URI().SetScheme("http")
	req.URI().SetHost(addr)
	req.Header.Set(headerPeerNode, c.cfg.Self)
	if c.cfg.Cluster != nil {
		if id := c.cfg.Cluster(); id != "" {
			req.Header.Set(headerCluster, id)
		}
	}
	if c.cfg.Secret != "" {
		req.Header.Set(headerClusterSecret, c.cfg.Secret)
	}
	return c.client(addr).DoTimeout(req, resp, timeout)
}

func (c *PeerClient) client(addr string) *fasthttp.HostClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	hc, ok := c.clients[addr]
	if !ok {
		hc = &fasthttp.HostClient{
			Addr: addr, Dial: c.cfg.Dial, MaxConns: peerConnsMax,
			MaxResponseBodySize:       InternalMaxBodyBytes,
			MaxIdemponentCallAttempts: 1, // a proposal must not be sent twice by the client
		}
		c.clients[addr] = hc
	}
	return hc
}

// ErrNotSent marks a peer call that surely did not reach the peer (the
// dial failed): it may be sent again.
var ErrNotSent = errors.New("not sent")

// Propose sends one encoded command to the leader, node id, and returns the
// HTTP status and the answer (a copy). An error wraps ErrNotSent when
// nothing reached the peer; otherwise the command may have arrived.
func (c *PeerClient) Propose(id string, command []byte, timeout time.Duration) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/internal/v1/propose")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType(contentTypeCommand)
	req.Header.Set(headerWireVersion, InternalWireVersion)
	req.SetBodyRaw(command)
	if err := c.do(id, req, resp, timeout); err != nil {
		if nothingSent(err) {
			return 0, nil, fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		return 0, nil, err
	}
	return resp.StatusCode(), bytes.Clone(resp.Body()), nil
}

// nothingSent reports whether a client error happened before the request
// could reach the peer.
func nothingSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, ErrNotSent) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrNoFreeConns)
}

// GetJSON reads path from node id into out.
func (c *PeerClient) GetJSON(id, path string, timeout time.Duration, out any) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(path)
	if err := c.do(id, req, resp, timeout); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("node %s %s: %d", id, path, resp.StatusCode())
	}
	return json.Unmarshal(resp.Body(), out)
}

// DialFunc dials a peer's HTTP address (fasthttp's dial hook).
type DialFunc = fasthttp.DialFunc
