package bench

import (
	"strconv"
	"sync"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// deductAnswer is what the bench reads of a deduct's answer.
type deductAnswer struct {
	Error   string
	OrderID string
}

// deductBuf is one request's scratch, pooled: the harness should cost the
// load it makes as little as it can, whichever server it loads.
type deductBuf struct {
	body   []byte
	parser fastjson.Parser
}

var deductBufs = sync.Pool{New: func() any { return &deductBuf{body: make([]byte, 0, 256)} }}

// deduct POSTs one deduct to path (pre-built by the caller) through
// worker's pool and reads the answer's status, error code and order id.
// The same call serves every HTTP row, stockd's and the no-op server's.
func (c httpClients) deduct(worker int, path, token string, r *Request) (int, deductAnswer, error) {
	hc := c[worker%len(c)]
	buf := deductBufs.Get().(*deductBuf)
	defer deductBufs.Put(buf)
	b := append(buf.body[:0], `{"user":`...)
	b = appendJSONString(b, r.User)
	b = append(b, `,"qty":`...)
	b = strconv.AppendInt(b, r.Qty, 10)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, r.RequestID)
	b = append(b, '}')
	buf.body = b

	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(path)
	req.SetHost(hc.Addr)
	if hc.IsTLS {
		req.URI().SetScheme("https")
	}
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.SetBodyRaw(b)
	if err := hc.DoTimeout(req, resp, requestTimeout); err != nil {
		return 0, deductAnswer{}, err
	}
	var a deductAnswer
	if v, err := buf.parser.ParseBytes(resp.Body()); err == nil {
		a.Error = string(v.GetStringBytes("error"))
		a.OrderID = string(v.GetStringBytes("order_id"))
	}
	return resp.StatusCode(), a, nil
}
