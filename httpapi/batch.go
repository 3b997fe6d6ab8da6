package httpapi

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
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
	// bodyBatchIdemKey: one header cannot name a hundred requests.
	bodyBatchIdemKey = precomputedError("bad_request", "Idempotency-Key names one request: in a batch, each item carries its own request_id")
)

func (s *Server) handleBatchDeduct(ctx *fasthttp.RequestCtx) {
	noWait, ok := waitArg(ctx)
	if !ok {
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer batchScratches.Put(sc)
	items, bad := sc.read.ReadBatch(ctx.PostBody(), BatchMaxItems, sc.items[:0])
	sc.items = items
	if bad == nil && deductwire.IdempotencyKeyGiven(&ctx.Request.Header) {
		bad = bodyBatchIdemKey
	}
	if bad != nil {
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return
	}
	sc.reset(len(items))
	hint := uint32(ctx.ConnID())
	for i := range items {
		req, bad := items[i].Req, items[i].Bad
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
	clear(sc.items)
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
	read    deductwire.Reader
	items   []deductwire.BatchItem
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
