package httpapi

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"stockd/engine"
)

// Batch deducts (DESIGN.md, "Batch deducts"): POST /v1/deducts carries up
// to BatchMaxItems deducts of any SKUs, for a gateway that aggregates its
// users' traffic. Each item is run as the single deduct would be, all at
// once, so they ride the same group commit; each gets the answer the
// single deduct would have got, in order (engine.DeductBatch). Items are
// independent: a bad one gets its own 400 and spoils nothing else.

const (
	// BatchMaxItems bounds one batch.
	BatchMaxItems = 1000
	// BatchMaxBodyBytes is the batch route's own body cap: 1,000 items of
	// ordinary ids fit with room to spare (the 16 KiB cap is for single
	// calls).
	BatchMaxBodyBytes = 1 << 20
	// itemAnswerBytes holds an item's answer with ordinary ids.
	itemAnswerBytes = 192
)

var (
	pathV1Deducts = []byte("/v1/deducts")
	keyDeducts    = "deducts"
	keySKU        = "sku"
	bodyBadBatch  = precomputedError("bad_request", `the body must be a JSON object with a "deducts" array of at most 1000 objects`)
)

func (s *Server) handleBatchDeduct(ctx *fasthttp.RequestCtx) {
	noWait, ok := waitArg(ctx)
	if !ok {
		return
	}
	p := deductParsers.Get()
	defer deductParsers.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil || v.Type() != fastjson.TypeObject {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadBatch)
		return
	}
	list := v.Get(keyDeducts)
	if list == nil || list.Type() != fastjson.TypeArray {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadBatch)
		return
	}
	items, _ := list.Array()
	if len(items) > BatchMaxItems {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadBatch)
		return
	}
	for _, it := range items {
		if it.Type() != fastjson.TypeObject {
			writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadBatch)
			return
		}
	}

	type answer struct {
		code int
		body []byte
	}
	answers := make([]answer, len(items))
	reqs := make([]engine.DeductRequest, 0, len(items))
	at := make([]int, 0, len(items)) // reqs[j] is item at[j]
	hint := uint32(ctx.ConnID())
	for i, it := range items {
		req, bad := batchItem(it)
		if bad != nil {
			answers[i] = answer{fasthttp.StatusBadRequest, bad}
			continue
		}
		req.NoWait, req.Hint = noWait, hint+uint32(i)
		reqs = append(reqs, req)
		at = append(at, i)
	}
	start := time.Now()
	results := make([]engine.DeductResult, len(reqs))
	s.engine.DeductBatch(reqs, results)
	// One buffer carved into each item's answer: an allocation a batch,
	// not one an item (an answer that outgrows its part gets its own).
	bufs := make([]byte, len(reqs)*itemAnswerBytes)
	for j := range results {
		s.latency.observe(start)
		code, body, _ := deductAnswer(&results[j], bufs[j*itemAnswerBytes:j*itemAnswerBytes:(j+1)*itemAnswerBytes])
		answers[at[j]] = answer{code, body}
	}

	out := make([]byte, 0, 64+len(items)*160)
	out = append(out, `{"results":[`...)
	for i, a := range answers {
		if i > 0 {
			out = append(out, ',')
		}
		// {"status":N, then the single deduct's answer without its brace.
		out = append(out, `{"status":`...)
		out = strconv.AppendInt(out, int64(a.code), 10)
		body := a.body
		for len(body) > 0 && (body[len(body)-1] == '\n' || body[len(body)-1] == ' ') {
			body = body[:len(body)-1]
		}
		if len(body) > 2 {
			out = append(out, ',')
			out = append(out, body[1:]...)
		} else {
			out = append(out, '}')
		}
	}
	out = append(out, "]}\n"...)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(out)
}

// batchItem reads one item as the single deduct route reads its body (the
// SKU in the item instead of the path); bad is the item's 400 answer.
// The request's byte slices are copies: the parser's memory goes back to
// its pool before the item's deduct ends.
func batchItem(v *fastjson.Value) (req engine.DeductRequest, bad []byte) {
	sku, ok := stringField(v, keySKU, true)
	if !ok || !validID(sku) {
		return req, bodyBadSKU
	}
	user, requestID, qty, bad := deductFields(v)
	if bad != nil {
		return req, bad
	}
	return engine.DeductRequest{SKU: clone(sku), User: clone(user), RequestID: clone(requestID), Qty: qty}, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
