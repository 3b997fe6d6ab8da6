package httpapi

import (
	"bytes"
	"crypto/subtle"

	"github.com/valyala/fasthttp"
)

// Who may call what: three credentials, each guarding its
// routes whatever the caller's address, except that admin calls without an
// admin token come only from loopback.
//
//	admin token    sale config, restock, cluster membership, pprof
//	cluster secret every /internal/v1/* call; without one they are not served
//	service token  deducts, orders, confirm/cancel (optional; the admin
//	               token is accepted too)
//
// A follower relays admin and order calls to the leader with the caller's
// own Authorization header; when the caller was a loopback client of the
// follower (no admin token configured), the follower says so in
// headerRelayedLoopback, which the leader believes only beside a valid
// cluster secret.
const (
	headerClusterSecret   = "X-Stockd-Cluster-Secret"
	headerPeerNode        = "X-Stockd-Node"
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

// fromPeer reports whether the request carries the cluster secret (never
// true without one).
func (s *Server) fromPeer(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.ClusterSecret == "" {
		return false
	}
	got := ctx.Request.Header.Peek(headerClusterSecret)
	return subtle.ConstantTimeCompare(got, []byte(s.cfg.ClusterSecret)) == 1
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
	if s.cfg.ServiceToken == "" || bearerIs(ctx, s.cfg.ServiceToken) || (s.cfg.AdminToken != "" && bearerIs(ctx, s.cfg.AdminToken)) {
		return true
	}
	writeRaw(ctx, fasthttp.StatusUnauthorized, bodyNeedServiceToken)
	return false
}

var bodyNeedServiceToken = precomputedError("unauthorized", "this call needs Authorization: Bearer <service token>")

// peer checks the cluster secret of an internal call. Without a secret the
// internal routes are not served at all.
func (s *Server) peer(ctx *fasthttp.RequestCtx) bool {
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

// adminOrPeer lets a joining node in with either credential.
func (s *Server) adminOrPeer(ctx *fasthttp.RequestCtx) bool {
	if s.fromPeer(ctx) {
		return true
	}
	return s.admin(ctx)
}
