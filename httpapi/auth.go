package httpapi

import (
	"bytes"
	"crypto/subtle"
	"strconv"

	"github.com/valyala/fasthttp"

	"stockd/httpapi/deductwire"
)

// Who may call what: three credentials, each guarding its
// routes whatever the caller's address, except that admin calls without an
// admin token come only from loopback.
//
//	admin token    sale config, restock, cluster membership, pprof
//	node certificate every /internal/v1/* call, over the node port only
//	               (a cluster of node certificates)
//	cluster secret every /internal/v1/* call of a cluster without node
//	               certificates; without either they are not served
//	client certificate (with -http-client-ca) every route but the probes;
//	               it stands in for the service token
//	service token  deducts, orders, confirm/cancel (optional; the admin
//	               token is accepted too)
//
// A follower relays admin and order calls to the leader with the caller's
// own Authorization header; when the caller was a loopback client of the
// follower (no admin token configured), the follower says so in
// headerRelayedLoopback, which the leader believes only beside a valid
// cluster secret.
const (
	headerClusterSecret = "X-Stockd-Cluster-Secret"
	headerPeerNode      = "X-Stockd-Node"
	// headerCluster carries a restored cluster's identity on node-to-node
	// calls (Config.ClusterID).
	headerCluster         = "X-Stockd-Cluster"
	headerRelayedLoopback = "X-Stockd-Relayed-Loopback"
	// headerAppliedIndex, on an answer to a relayed call, is the leader's
	// applied index once the call's command applied: the relaying node
	// waits to apply it too, so its caller reads its own write there.
	headerAppliedIndex = "X-Stockd-Applied-Index"
)

var bearerPrefix = []byte("Bearer ")

// bearerIs reports whether the request carries Authorization: Bearer want.
func bearerIs(ctx *fasthttp.RequestCtx, want string) bool {
	token, ok := bytes.CutPrefix(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), bearerPrefix)
	return ok && subtle.ConstantTimeCompare(token, []byte(want)) == 1
}

// PeerConn is a node-to-node connection whose certificate proved which
// node it comes from (the node port's connections).
type PeerConn interface {
	PeerID() string
}

// fromPeer reports whether the request comes from another node of the
// cluster: over a node-port connection on a cluster of node certificates,
// with the cluster secret on one without (never true without either).
func (s *Server) fromPeer(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.PeerTLS {
		_, ok := ctx.Conn().(PeerConn)
		return ok
	}
	if s.cfg.ClusterSecret == "" {
		return false
	}
	got := ctx.Request.Header.Peek(headerClusterSecret)
	return subtle.ConstantTimeCompare(got, []byte(s.cfg.ClusterSecret)) == 1
}

// peerName is the node a peer's request comes from: its certificate's
// name on a cluster of node certificates, the name it gives otherwise.
func (s *Server) peerName(ctx *fasthttp.RequestCtx) string {
	if pc, ok := ctx.Conn().(PeerConn); ok && s.cfg.PeerTLS {
		return pc.PeerID()
	}
	return string(ctx.Request.Header.Peek(headerPeerNode))
}

// loopbackCaller reports whether the caller is a loopback client of this
// node, or of the peer that relayed the call.
func (s *Server) loopbackCaller(ctx *fasthttp.RequestCtx) bool {
	if ctx.RemoteIP().IsLoopback() {
		return true
	}
	return len(ctx.Request.Header.Peek(headerRelayedLoopback)) > 0 && s.fromPeer(ctx)
}

// admin checks the admin token, or without one, that the caller is local.
func (s *Server) admin(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.AdminToken == "" {
		if s.loopbackCaller(ctx) {
			return true
		}
		writeError(ctx, fasthttp.StatusForbidden, "forbidden", "admin calls need an admin token, or a loopback client when none is configured")
		return false
	}
	if bearerIs(ctx, s.cfg.AdminToken) {
		return true
	}
	writeError(ctx, fasthttp.StatusUnauthorized, "unauthorized", "admin calls need Authorization: Bearer <admin token>")
	return false
}

// service checks the service token when one is configured (the admin
// token also passes). It runs on every deduct: a few byte compares, no
// allocation.
func (s *Server) service(ctx *fasthttp.RequestCtx) bool {
	if s.creds.Service(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)) {
		return true
	}
	writeRaw(ctx, fasthttp.StatusUnauthorized, deductwire.BodyNeedServiceToken)
	return false
}

// peer checks that an internal call comes from another node: over the
// node port on a cluster of node certificates, where a peer that names
// another node than its certificate does is refused; with the cluster
// secret otherwise. Without either the internal routes are not served.
func (s *Server) peer(ctx *fasthttp.RequestCtx) bool {
	if own := s.clusterID(); own != "" {
		if said := string(ctx.Request.Header.Peek(headerCluster)); said != own {
			s.logger.Warn("refused a node-to-node call of another cluster", "peer", string(ctx.Request.Header.Peek(headerPeerNode)), "peer_addr", ctx.RemoteAddr().String(), "its_cluster", said, "cluster", own, "path", string(ctx.Path()))
			writeError(ctx, fasthttp.StatusForbidden, "other_cluster", "this node belongs to cluster "+own+"; the call names "+strconv.Quote(said))
			return false
		}
	}
	if s.cfg.PeerTLS {
		pc, ok := ctx.Conn().(PeerConn)
		if !ok {
			writeError(ctx, fasthttp.StatusNotFound, "not_found", "internal routes are served on the node port only")
			return false
		}
		if said := ctx.Request.Header.Peek(headerPeerNode); len(said) > 0 && string(said) != pc.PeerID() {
			s.logger.Warn("refused a node-to-node call in another node's name", "peer", pc.PeerID(), "named", string(said), "peer_addr", ctx.RemoteAddr().String(), "path", string(ctx.Path()))
			writeError(ctx, fasthttp.StatusForbidden, "forbidden", "node "+strconv.Quote(pc.PeerID())+" may not call in the name of "+strconv.Quote(string(said)))
			return false
		}
		return true
	}
	if s.cfg.ClusterSecret == "" {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "internal routes are off: this node has no -cluster-secret")
		return false
	}
	if s.fromPeer(ctx) {
		return true
	}
	writeError(ctx, fasthttp.StatusForbidden, "forbidden", "internal routes need the cluster secret")
	return false
}

// clusterID is this node's cluster identity ("": none).
func (s *Server) clusterID() string {
	if s.cfg.ClusterID == nil {
		return ""
	}
	return s.cfg.ClusterID()
}

// clientCertMissing answers 401 and reports true when this node requires
// client certificates and the caller presented none. Probes and scrapers
// (/healthz, /readyz, /metrics) need none; nor do other nodes, whose
// certificates the node port checked.
func (s *Server) clientCertMissing(ctx *fasthttp.RequestCtx, path []byte) bool {
	if !s.cfg.ClientCerts {
		return false
	}
	switch string(path) {
	case "/healthz", "/readyz", "/metrics":
		return false
	}
	if _, ok := ctx.Conn().(PeerConn); ok {
		return false
	}
	if cs := ctx.TLSConnectionState(); cs != nil && len(cs.PeerCertificates) > 0 {
		return false // verified against -http-client-ca in the handshake
	}
	writeRaw(ctx, fasthttp.StatusUnauthorized, bodyNeedClientCert)
	return true
}

var bodyNeedClientCert = precomputedError("client_certificate_required", "this node takes calls only from clients with a certificate signed by its -http-client-ca")

// adminOrPeer lets a joining node in with either credential.
func (s *Server) adminOrPeer(ctx *fasthttp.RequestCtx) bool {
	if s.fromPeer(ctx) {
		return true
	}
	return s.admin(ctx)
}
