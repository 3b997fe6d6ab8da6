package httpapi

import (
	"context"

	"github.com/valyala/fasthttp"
	"stockd.dev/stockd/engine"
)

// caughtUp is a read's step before it answers 404: a sale, order or entry
// made through another node a moment ago may not be in this node's ledger
// yet, so the node catches up with the cluster (engine.CatchUp) and the
// caller reads again. It reports false, having answered 503, when the node
// could not: a 404 it cannot vouch for would be taken as final. The
// catch-up's context is not the request's: fasthttp reuses a RequestCtx
// once the handler returns, and a context timer may still read its parent
// then.
func (s *Server) caughtUp(ctx *fasthttp.RequestCtx) bool {
	if err := s.engine.CatchUp(context.Background()); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return false
	}
	return true
}

// readGate runs before every read of the ledger a GET serves (a sale, an
// order, an entry, an audit, a draw, the orders and entries streams, the
// events): the node's ledger first holds every write this node has
// answered, so that it never contradicts itself; with
// consistency=linearizable, every write the cluster acknowledged before
// the call. It reports false having answered 400 or 503.
func (s *Server) readGate(ctx *fasthttp.RequestCtx) bool {
	_, ok := s.gate(ctx, false)
	return ok
}

// gate is readGate; with staleOK, a node that cannot apply what it
// answered in time (cut off from its leader) serves its last applied
// state anyway and reports stale: a sale's figures, marked so.
func (s *Server) gate(ctx *fasthttp.RequestCtx, staleOK bool) (stale, ok bool) {
	args := ctx.QueryArgs()
	linearizable := false
	if args.Has("consistency") {
		if string(args.Peek("consistency")) != "linearizable" {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "consistency must be linearizable, or absent for this node's own view")
			return false, false
		}
		linearizable = true
	}
	if err := s.engine.ReadFresh(context.Background(), linearizable); err != nil {
		if staleOK && !linearizable {
			return true, true
		}
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return false, false
	}
	return false, true
}

// saleCaughtUp reads sale sku after the read gate, caught up with the
// cluster before it finds none (caughtUp); answered reports that it wrote
// a 400 or 503 itself.
func (s *Server) saleCaughtUp(ctx *fasthttp.RequestCtx, sku []byte) (v engine.SKUView, ok, answered bool) {
	if !s.readGate(ctx) {
		return v, false, true
	}
	return s.saleOrCatchUp(ctx, sku)
}

// saleOrCatchUp is saleCaughtUp past the gate.
func (s *Server) saleOrCatchUp(ctx *fasthttp.RequestCtx, sku []byte) (v engine.SKUView, ok, answered bool) {
	if v, ok = s.engine.SKU(string(sku)); ok {
		return v, true, false
	}
	if !s.caughtUp(ctx) {
		return v, false, true
	}
	v, ok = s.engine.SKU(string(sku))
	return v, ok, false
}
