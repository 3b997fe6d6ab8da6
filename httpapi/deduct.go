package httpapi

import (
	"sync"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"stockd/engine"
	"stockd/httpapi/deductwire"
)

// The answers and rules of a single deduct live in deductwire, which the
// event loop reads deducts with too; these are the names the rest of
// httpapi uses for them.
var (
	bodyBadSKU     = deductwire.BodyBadSKU
	bodyBadIdemKey = deductwire.BodyBadIdemKey
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

var (
	deductScratchPool sync.Pool
	deductParsers     fastjson.ParserPool
)

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

// parseObject parses the request's body with a pooled parser, which the
// caller puts back once done with v. A body that is not a JSON object is
// answered 400 with bad, and p is nil.
func parseObject(ctx *fasthttp.RequestCtx, bad []byte) (p *fastjson.Parser, v *fastjson.Value) {
	p = deductParsers.Get()
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil || v.Type() != fastjson.TypeObject {
		deductParsers.Put(p)
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return nil, nil
	}
	return p, v
}

// validID reports whether b is a usable id (deductwire.ValidID).
func validID(b []byte) bool { return deductwire.ValidID(b) }
