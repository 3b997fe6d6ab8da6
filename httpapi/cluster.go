package httpapi

import (
	"context"
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
	// relayApplyWait bounds how long a relayed call waits for this node
	// to apply what the leader applied.
	relayApplyWait = 5 * time.Second
)

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
	if err := s.peers.Do(leader, req, resp, proxyTimeout); err != nil {
		if s.peers.NotSent(err) {
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
	if s.peers.FromPeer(ctx) {
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
			if s.peers.Status(n.ID, peerStatusTimeout, &peer) == nil {
				n.Reachable, n.State, n.Term, n.CommitIndex, n.AppliedIndex = true, peer.State, peer.Term, peer.CommitIndex, peer.AppliedIndex
				n.RulesKnown = peer.RulesKnown
			}
		}()
	}
	wg.Wait()
	return st
}
