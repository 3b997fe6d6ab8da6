package httpapi

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"stockd/engine"
)

// Precomputed answers for the common losing outcomes.
var (
	bodySoldOut     = precomputedError("sold_out", "no units left")
	bodyUserLimit   = precomputedError("user_limit", "this user has bought the most units the sale allows")
	bodyUnknownSKU  = precomputedError("unknown_sku", "no sale with this sku")
	bodyClosed      = precomputedError("closed", "the sale is closed")
	bodyLotterySale = precomputedError("lottery_sale", "this sale is a lottery: POST /v1/skus/{sku}/enter")
	bodyRateLimited = precomputedError("rate_limited", "too many requests; retry after the given seconds")
	bodyTryAgain    = precomputedError("try_again", "the last units are still held by other nodes; retry after the given seconds")
	bodyBadJSON     = precomputedError("bad_request", `body must be a JSON object {"user": string, "qty": integer, "request_id": string}`)
	bodyBadUser     = precomputedError("bad_request", "user must be a non-empty string of at most 128 bytes")
	bodyBadQty      = precomputedError("bad_request", "qty must be an integer from 1 to "+strconv.Itoa(engine.MaxQtyPerDeduct))
	bodyBadReqID    = precomputedError("bad_request", "request_id must be a string of at most 128 bytes, without control characters")
	bodyBadIdemKey  = precomputedError("bad_request", "the Idempotency-Key header and the body's request_id differ: send one, or both the same")
	bodyReused      = precomputedError("request_id_reused", "this user already used this request_id for another sku or qty (or a lottery entry); nothing changed: use a new request_id for a new purchase")
	bodyBadSKU      = precomputedError("bad_request", "sku must be 1 to 128 letters, digits or . _ - :")
	bodyBadWait     = precomputedError("bad_request", "wait must be commit or none")
)

var (
	keyUser      = "user"
	keyQty       = "qty"
	keyRequestID = "request_id"
	argWait      = []byte("wait")
	// headerIdempotencyKey may carry a deduct's or an entry's request id
	// instead of the body's request_id field.
	headerIdempotencyKey = []byte("Idempotency-Key")
)

// deductScratch is one request's engine call state, pooled so the call
// through the Engine interface does not allocate.
type deductScratch struct {
	req engine.DeductRequest
	res engine.DeductResult
	buf []byte
}

var (
	deductScratchPool sync.Pool
	deductParsers     fastjson.ParserPool
)

func (s *Server) handleDeduct(ctx *fasthttp.RequestCtx, sku []byte) {
	start := requestStart(ctx)
	defer s.latency.observe(start)
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	noWait, ok := waitArg(ctx)
	if !ok {
		return
	}
	var user, requestID, bad []byte
	var qty int64
	if f, ok := scanDeduct(ctx.PostBody()); ok {
		user, requestID, qty, bad = f.check()
	} else {
		p, v := parseObject(ctx, bodyBadJSON)
		if p == nil {
			return
		}
		defer deductParsers.Put(p)
		user, requestID, qty, bad = deductFields(v)
	}
	if bad == nil {
		requestID, bad = idempotencyKey(ctx, requestID)
	}
	if bad != nil {
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return
	}

	sc, _ := deductScratchPool.Get().(*deductScratch)
	if sc == nil {
		sc = &deductScratch{buf: make([]byte, 0, 256)}
	}
	defer deductScratchPool.Put(sc)
	sc.req = engine.DeductRequest{SKU: sku, User: user, RequestID: requestID, Qty: qty, NoWait: noWait, Hint: uint32(ctx.ConnID())}
	s.engine.Deduct(&sc.req, &sc.res)
	sc.req = engine.DeductRequest{} // keep no view into the request past the handler
	s.writeDeductResult(ctx, sc)
}

// idempotencyKey merges the Idempotency-Key header into the body's
// request id: the header alone names it, both must agree. bad is the 400
// answer to a header that is not a valid id or differs from the body.
func idempotencyKey(ctx *fasthttp.RequestCtx, requestID []byte) ([]byte, []byte) {
	h := ctx.Request.Header.PeekBytes(headerIdempotencyKey)
	switch {
	case len(h) == 0:
		return requestID, nil
	case !validRequestID(h):
		return nil, bodyBadReqID
	case len(requestID) > 0 && string(h) != string(requestID):
		return nil, bodyBadIdemKey
	}
	return h, nil
}

// validRequestID reports whether id is at most maxIDBytes without control
// characters (the ledger keys user-scoped ids with a 0x00 byte in front).
func validRequestID(id []byte) bool {
	if len(id) > maxIDBytes {
		return false
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// waitArg reads ?wait=commit|none; on a bad value it answers 400 and
// reports false.
func waitArg(ctx *fasthttp.RequestCtx) (noWait, ok bool) {
	w := ctx.QueryArgs().PeekBytes(argWait)
	switch string(w) {
	case "", "commit":
		return false, true
	case "none":
		return true, true
	}
	writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadWait)
	return false, false
}

// deductFields reads a deduct's user, request id and qty (absent: one
// unit); bad is the 400 answer to a field that is not right. The byte
// slices point into v.
func deductFields(v *fastjson.Value) (user, requestID []byte, qty int64, bad []byte) {
	user, ok := stringField(v, keyUser, true)
	if !ok || len(user) > maxIDBytes {
		return nil, nil, 0, bodyBadUser
	}
	requestID, ok = stringField(v, keyRequestID, false)
	if !ok || !validRequestID(requestID) {
		return nil, nil, 0, bodyBadReqID
	}
	qty = 1
	if q := v.Get(keyQty); q != nil {
		n, err := q.Int64()
		if err != nil || q.Type() != fastjson.TypeNumber || n < 1 || n > engine.MaxQtyPerDeduct {
			return nil, nil, 0, bodyBadQty
		}
		qty = n
	}
	return user, requestID, qty, nil
}

// check is deductFields for a body scanDeduct read: the same answers to
// the same values.
func (f *deductBody) check() (user, requestID []byte, qty int64, bad []byte) {
	if !f.hasUser || len(f.user) == 0 || len(f.user) > maxIDBytes {
		return nil, nil, 0, bodyBadUser
	}
	if !validRequestID(f.requestID) {
		return nil, nil, 0, bodyBadReqID
	}
	qty = 1
	if f.hasQty {
		if f.qty < 1 || f.qty > engine.MaxQtyPerDeduct {
			return nil, nil, 0, bodyBadQty
		}
		qty = f.qty
	}
	return f.user, f.requestID, qty, nil
}

// stringField reads key as a string. A missing key is ok unless required;
// a key of another type is not.
func stringField(v *fastjson.Value, key string, required bool) ([]byte, bool) {
	f := v.Get(key)
	if f == nil {
		return nil, !required
	}
	b, err := f.StringBytes()
	if err != nil || (required && len(b) == 0) {
		return nil, false
	}
	return b, true
}

func (s *Server) writeDeductResult(ctx *fasthttp.RequestCtx, sc *deductScratch) {
	// The answer is built in sc.buf (or is a precomputed body, which
	// sc.buf never takes on).
	code, body, retryAfter := deductAnswer(&sc.res, sc.buf[:0])
	if retryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	}
	writeRaw(ctx, code, body)
}

// deductAnswer is the HTTP answer to a deduct's result: status code, JSON
// body (built in buf when not precomputed; the caller must not change a
// precomputed one) and, for 425 and 429, the Retry-After seconds.
func deductAnswer(res *engine.DeductResult, buf []byte) (code int, body []byte, retryAfter int64) {
	switch res.Status {
	case engine.StatusOK, engine.StatusAccepted:
		code = fasthttp.StatusOK
		if res.Status == engine.StatusAccepted {
			code = fasthttp.StatusAccepted
		}
		b := buf
		b = append(b, `{"order_id":`...)
		b = appendJSONString(b, res.Order.ID)
		b = append(b, `,"state":`...)
		b = appendJSONString(b, string(res.Order.State))
		b = append(b, `,"sku":`...)
		b = appendJSONString(b, res.Order.SKU)
		b = append(b, `,"qty":`...)
		b = appendInt(b, res.Order.Qty)
		if res.Order.ExpiresAtUnixNano != 0 {
			b = append(b, `,"expires_at":`...)
			b = appendJSONString(b, time.Unix(0, res.Order.ExpiresAtUnixNano).UTC().Format(time.RFC3339Nano))
		}
		return code, append(b, "}\n"...), 0
	case engine.StatusSoldOut:
		if res.Detail != "" {
			return fasthttp.StatusConflict, errorJSON(buf, "sold_out", res.Detail), 0
		}
		return fasthttp.StatusConflict, bodySoldOut, 0
	case engine.StatusUserLimit:
		return fasthttp.StatusConflict, bodyUserLimit, 0
	case engine.StatusUnknownSKU:
		return fasthttp.StatusNotFound, bodyUnknownSKU, 0
	case engine.StatusClosed:
		return fasthttp.StatusConflict, bodyClosed, 0
	case engine.StatusLotterySale:
		return fasthttp.StatusConflict, bodyLotterySale, 0
	case engine.StatusRequestIDReused:
		return fasthttp.StatusUnprocessableEntity, bodyReused, 0
	case engine.StatusNotStarted:
		left := time.Until(res.StartAt)
		b, _ := json.Marshal(map[string]any{
			"error": "not_started", "detail": "the sale opens at start_at",
			"start_at": res.StartAt.UTC().Format(time.RFC3339Nano), "starts_in_ms": left.Milliseconds(),
		})
		return statusTooEarly, append(b, '\n'), int64(left.Seconds()) + 1
	case engine.StatusRateLimited, engine.StatusTryAgain:
		// Retry-After is in whole seconds; round up so a client never
		// comes back early.
		secs := max(int64((res.RetryAfter+time.Second-1)/time.Second), 1)
		if res.Status == engine.StatusTryAgain {
			return fasthttp.StatusTooManyRequests, bodyTryAgain, secs
		}
		return fasthttp.StatusTooManyRequests, bodyRateLimited, secs
	case engine.StatusBadRequest:
		return fasthttp.StatusBadRequest, bodyBadQty, 0
	case engine.StatusOutcomeUnknown:
		return fasthttp.StatusGatewayTimeout, errorJSON(buf, "outcome_unknown", res.Detail), 0
	}
	return fasthttp.StatusServiceUnavailable, errorJSON(buf, "unavailable", res.Detail), 0
}

// errorJSON appends an error body to buf.
func errorJSON(buf []byte, errCode, detail string) []byte {
	buf = append(buf, `{"error":`...)
	buf = appendJSONString(buf, errCode)
	buf = append(buf, `,"detail":`...)
	buf = appendJSONString(buf, detail)
	return append(buf, "}\n"...)
}

// statusTooEarly is 425, which fasthttp names no constant for.
const statusTooEarly = 425

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
