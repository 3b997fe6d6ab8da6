package bench

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The stockd-batch strategy: a gateway that aggregates its users' deducts
// into POST /v1/deducts, batchSize buyers a request. Its row counts units
// (buyers answered) per second, against the no-op floor's requests per
// second: one HTTP request carries many units.

const batchSize = 100

// batchDeducter is a strategy that answers many requests in one call; the
// runner then hands each worker batchSize requests at a time.
type batchDeducter interface {
	BatchSize() int
	DeductBatch(ctx context.Context, worker int, rs []Request) []Outcome
}

type stockdBatchStrategy struct {
	*stockdStrategy
}

func newStockdBatch(targets []string, conns int, token, service string, tlsCfg *tls.Config) *stockdBatchStrategy {
	s := newStockd(targets, conns, token, service, false, tlsCfg)
	s.name = "stockd-batch"
	return &stockdBatchStrategy{s}
}

func (s *stockdBatchStrategy) Supports(sc *Scenario) string {
	if sc.HoldTTL > 0 {
		return "holds are confirmed one order at a time"
	}
	return ""
}

func (s *stockdBatchStrategy) BatchSize() int { return batchSize }

// batchBuf is one batch call's scratch, pooled like deductBuf.
type batchBuf struct {
	body   []byte
	answer []byte
	parser fastjson.Parser
}

var batchBufs = sync.Pool{New: func() any { return &batchBuf{body: make([]byte, 0, 16+batchSize*96)} }}

// DeductBatch sends rs as one POST /v1/deducts and reads each item's answer.
func (s *stockdBatchStrategy) DeductBatch(_ context.Context, worker int, rs []Request) []Outcome {
	out := make([]Outcome, len(rs))
	buf := batchBufs.Get().(*batchBuf)
	defer batchBufs.Put(buf)
	body := append(buf.body[:0], `{"deducts":[`...)
	for i := range rs {
		r := &rs[i]
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"sku":`...)
		body = appendJSONString(body, s.sc.SKUs[r.SKU])
		body = append(body, `,"user":`...)
		body = appendJSONString(body, r.User)
		body = append(body, `,"qty":`...)
		body = strconv.AppendInt(body, r.Qty, 10)
		body = append(body, `,"request_id":`...)
		body = appendJSONString(body, r.RequestID)
		body = append(body, '}')
	}
	body = append(body, "]}"...)
	buf.body = body
	code, resp, err := s.clients.doAppend(worker, fasthttp.MethodPost, "/v1/deducts", s.service, body, buf.answer[:0])
	buf.answer = resp
	if err == nil && code != fasthttp.StatusOK {
		err = fmt.Errorf("batch: %d %s", code, resp)
	}
	var results []*fastjson.Value
	if err == nil {
		v, perr := buf.parser.ParseBytes(resp)
		if perr != nil {
			err = fmt.Errorf("batch answer: %w", perr)
		} else if results = v.GetArray("results"); len(results) != len(rs) {
			err = fmt.Errorf("batch answer: %d results for %d deducts", len(results), len(rs))
		}
	}
	for i := range out {
		if err != nil {
			out[i] = Outcome{Err: err}
			continue
		}
		r := results[i]
		switch status := r.GetInt("status"); status {
		case fasthttp.StatusOK, fasthttp.StatusAccepted:
			out[i] = Outcome{Win: true, OrderID: string(r.GetStringBytes("order_id"))}
		case fasthttp.StatusConflict:
			out[i] = Outcome{Reason: string(r.GetStringBytes("error"))}
		default:
			out[i] = Outcome{Err: fmt.Errorf("%d %s", status, r.GetStringBytes("error"))}
		}
	}
	return out
}

// appendJSONString appends s as a JSON string. The harness's ids and SKU
// names are plain ASCII, copied as they are; anything else goes through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
