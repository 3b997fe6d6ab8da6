package httpapi

import (
	"bytes"
	"crypto/subtle"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/httpapi/deductwire"
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
// node it comes from (the node port's connections): it needs no client
// certificate of the public kind.
type PeerConn interface {
	PeerID() string
}

// loopbackCaller reports whether the caller is a loopback client of this
// node, or of the peer that relayed the call.
func (s *Server) loopbackCaller(ctx *fasthttp.RequestCtx) bool {
	if ctx.RemoteIP().IsLoopback() {
		return true
	}
	return len(ctx.Request.Header.Peek(headerRelayedLoopback)) > 0 && s.peers.FromPeer(ctx)
}

// isAdmin is admin without answering: whether the caller holds the admin
// token (or, with none configured, calls from loopback).
func (s *Server) isAdmin(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.AdminToken == "" {
		return s.loopbackCaller(ctx)
	}
	return bearerIs(ctx, s.cfg.AdminToken)
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
	if s.peers.FromPeer(ctx) {
		return true
	}
	return s.admin(ctx)
}
