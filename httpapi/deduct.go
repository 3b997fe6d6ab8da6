package httpapi

import (
	"sync"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
)

// The answers and rules of a single deduct live in deductwire, which the
// event loop reads deducts with too; these are the names the rest of
// httpapi uses for them.
var (
	bodyBadSKU     = deductwire.BodyBadSKU
	bodyUnknownSKU = deductwire.BodyUnknownSKU
)

const (
	// MaxBodyBytes bounds a request body (deductwire.MaxBodyBytes).
	MaxBodyBytes = deductwire.MaxBodyBytes
	maxIDBytes   = deductwire.MaxIDBytes
)

// deductScratch is one request's engine call state, pooled so the call
// through the Engine interface does not allocate.
type deductScratch struct {
	read deductwire.Reader
	req  engine.DeductRequest
	res  engine.DeductResult
	buf  []byte
}

var deductScratchPool sync.Pool

// handleDeduct serves POST /v1/skus/{sku}/deduct, whose credentials the
// router checked: deductwire reads it and answers it, as at the event
// loop's door.
func (s *Server) handleDeduct(ctx *fasthttp.RequestCtx, sku []byte) {
	start := requestStart(ctx)
	defer s.latency.observe(start)
	sc, _ := deductScratchPool.Get().(*deductScratch)
	if sc == nil {
		sc = &deductScratch{buf: make([]byte, 0, 256)}
	}
	defer deductScratchPool.Put(sc)
	if status, bad := sc.read.Read(&ctx.Request, sku, &sc.req); status != 0 {
		a := deductwire.Refusal(status, bad)
		a.WriteTo(&ctx.Response)
		return
	}
	sc.req.Hint = uint32(ctx.ConnID())
	s.engine.Deduct(&sc.req, &sc.res)
	sc.req = engine.DeductRequest{} // keep no view into the request past the handler
	a := deductwire.Result(&sc.res, sc.buf[:0])
	a.WriteTo(&ctx.Response)
}

// waitArg reads ?wait=commit|none; on a bad value it answers 400 and
// reports false.
func waitArg(ctx *fasthttp.RequestCtx) (noWait, ok bool) {
	noWait, bad := deductwire.Wait(ctx.QueryArgs())
	if bad != nil {
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return false, false
	}
	return noWait, true
}

// deductAnswer is deductwire.Result as its three parts.
func deductAnswer(res *engine.DeductResult, buf []byte) (code int, body []byte, retryAfter int64) {
	a := deductwire.Result(res, buf)
	return a.Status, a.Body, a.RetryAfter
}

// validID reports whether b is a usable id (deductwire.ValidID).
func validID(b []byte) bool { return deductwire.ValidID(b) }
