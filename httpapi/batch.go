package httpapi

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"stockd/engine"
	"stockd/httpapi/deductwire"
)

// Batch deducts (docs/http.md): POST /v1/deducts carries up
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
	// bodyBatchIdemKey: one header cannot name a hundred requests.
	bodyBatchIdemKey = precomputedError("bad_request", "Idempotency-Key names one request: in a batch, each item carries its own request_id")
)

func (s *Server) handleBatchDeduct(ctx *fasthttp.RequestCtx) {
	noWait, ok := waitArg(ctx)
	if !ok {
		return
	}
	p, v := parseObject(ctx, bodyBadBatch)
	if p == nil {
		return
	}
	defer deductParsers.Put(p)
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
	if len(ctx.Request.Header.Peek(deductwire.HeaderIdempotencyKey)) > 0 {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBatchIdemKey)
		return
	}

	sc := batchScratches.Get().(*batchScratch)
	defer batchScratches.Put(sc)
	sc.reset(len(items))
	hint := uint32(ctx.ConnID())
	for i, it := range items {
		req, bad := batchItem(it)
		if bad != nil {
			sc.answers[i] = batchAnswer{fasthttp.StatusBadRequest, bad}
			continue
		}
		req.NoWait, req.Hint = noWait, hint+uint32(i)
		sc.reqs = append(sc.reqs, req)
		sc.at = append(sc.at, i)
	}
	start := requestStart(ctx)
	results := sc.results[:len(sc.reqs)]
	s.engine.DeductBatch(sc.reqs, results)
	clear(sc.reqs) // keep no view into the request past the handler
	s.latency.observeN(time.Since(start), len(results))
	// One buffer carved into each item's answer (an answer that outgrows
	// its part gets its own).
	bufs := sc.bufs[:len(results)*itemAnswerBytes]
	for j := range results {
		code, body, _ := deductAnswer(&results[j], bufs[j*itemAnswerBytes:j*itemAnswerBytes:(j+1)*itemAnswerBytes])
		sc.answers[sc.at[j]] = batchAnswer{code, body}
	}

	sc.out = appendBatchAnswers(sc.out[:0], sc.answers)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(sc.out) // a copy: the scratch goes back to its pool
}

// appendBatchAnswers appends the batch's answer: each item as
// {"status":N, then the single deduct's answer without its brace.
func appendBatchAnswers(out []byte, answers []batchAnswer) []byte {
	out = append(out, `{"results":[`...)
	for i, a := range answers {
		if i > 0 {
			out = append(out, ',')
		}
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
	return append(out, "]}\n"...)
}

// batchAnswer is one item's answer: its status and the single deduct's body.
type batchAnswer struct {
	code int
	body []byte
}

// batchScratch is one batch call's working memory, pooled: a batch of a
// hundred buyers would otherwise allocate it all afresh each time.
type batchScratch struct {
	answers []batchAnswer
	reqs    []engine.DeductRequest
	at      []int // reqs[j] is item at[j]
	results []engine.DeductResult
	bufs    []byte
	out     []byte
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

// reset readies sc for a batch of n items, dropping what the last batch
// left in it (its answers point into its buffers; its results hold orders).
func (sc *batchScratch) reset(n int) {
	sc.answers = slices.Grow(sc.answers[:0], n)[:n]
	clear(sc.answers)
	sc.reqs = slices.Grow(sc.reqs[:0], n)
	sc.at = slices.Grow(sc.at[:0], n)
	sc.results = slices.Grow(sc.results[:0], n)[:n]
	clear(sc.results)
	sc.bufs = slices.Grow(sc.bufs[:0], n*itemAnswerBytes)[:n*itemAnswerBytes]
	sc.out = slices.Grow(sc.out[:0], 64+n*160)
}

// batchItem reads one item as the single deduct route reads its body (the
// SKU in the item instead of the path); bad is the item's 400 answer. The
// request's byte slices are views into the parser's memory, which goes
// back to its pool only after the batch's deducts have all answered.
func batchItem(v *fastjson.Value) (req engine.DeductRequest, bad []byte) {
	sku, ok := deductwire.StringField(v, keySKU, true)
	if !ok || !validID(sku) {
		return req, bodyBadSKU
	}
	user, requestID, qty, bad := deductwire.Fields(v)
	if bad != nil {
		return req, bad
	}
	return engine.DeductRequest{SKU: sku, User: user, RequestID: requestID, Qty: qty}, nil
}
