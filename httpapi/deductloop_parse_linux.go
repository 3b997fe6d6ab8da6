package httpapi

import (
	"bytes"
	"crypto/subtle"
	"strconv"
	"syscall"

	"github.com/valyala/fasthttp"

	"stockd/engine"
)

// The event loop's own reading of a request, and its answers: only what
// a plain deduct needs. Anything else is left to fasthttp (parse reports
// serve false), which reads it from the start.

var (
	crlf                   = []byte("\r\n")
	crlfcrlf               = []byte("\r\n\r\n")
	bearerHeader           = []byte(fasthttp.HeaderAuthorization)
	contentLengthHeader    = []byte(fasthttp.HeaderContentLength)
	connectionHeader       = []byte(fasthttp.HeaderConnection)
	transferEncodingHeader = []byte(fasthttp.HeaderTransferEncoding)
	expectHeader           = []byte(fasthttp.HeaderExpect)
)

// loopRequest is what the loop reads from a plain deduct's head.
type loopRequest struct {
	sku, idem, auth   []byte
	noWait, keepAlive bool
	length            int // Content-Length; -1 without one
}

// parse serves the request at the head of c.in if it is a plain deduct:
// n is the bytes it took (0 with serve true: not complete yet; 0 with
// serve false: not one the loop serves).
func (l *deductLoop) parse(c *loopConn) (n int, serve bool) {
	b := c.in
	end := bytes.Index(b, crlfcrlf)
	if end < 0 {
		return 0, len(b) < loopMaxHead
	}
	r, ok := parseHead(b[:end])
	if !ok || r.length < 0 || !l.authorized(r.auth) {
		return 0, false
	}
	n = end + len(crlfcrlf) + r.length
	if len(b) < n {
		return 0, true
	}
	req, ok := r.deduct(b[end+len(crlfcrlf) : n])
	if !ok {
		return 0, false
	}
	req.Hint = c.hint
	c.req = req
	l.start(c, &c.req, !r.keepAlive)
	return n, true
}

// parseHead reads a request head, up to its blank line: a POST of a
// deduct route, HTTP/1.x, with headers the loop can take.
func parseHead(head []byte) (r loopRequest, ok bool) {
	line, rest, _ := bytes.Cut(head, crlf)
	method, line, _ := bytes.Cut(line, []byte{' '})
	target, proto, _ := bytes.Cut(line, []byte{' '})
	r.keepAlive = string(proto) == "HTTP/1.1"
	if string(method) != "POST" || (!r.keepAlive && string(proto) != "HTTP/1.0") {
		return r, false
	}
	path, query, _ := bytes.Cut(target, []byte{'?'})
	sku, ok := bytes.CutPrefix(path, pathV1SKUs)
	if !ok {
		return r, false
	}
	if r.sku, ok = bytes.CutSuffix(sku, suffixDeduct); !ok || !validID(r.sku) {
		return r, false
	}
	if r.noWait, ok = loopWait(query); !ok {
		return r, false
	}
	r.length = -1
	return r, r.headers(rest)
}

// headers reads the header lines; false on one the loop leaves to
// fasthttp (a malformed line, a second or bad Content-Length, chunked,
// Expect).
func (r *loopRequest) headers(rest []byte) bool {
	for len(rest) > 0 {
		var h []byte
		h, rest, _ = bytes.Cut(rest, crlf)
		name, value, found := bytes.Cut(h, []byte{':'})
		if !found || len(name) == 0 || bytes.ContainsAny(name, " \t") {
			return false
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, contentLengthHeader):
			v, err := strconv.Atoi(string(value))
			if err != nil || v < 0 || v > MaxBodyBytes || r.length >= 0 {
				return false
			}
			r.length = v
		case bytes.EqualFold(name, connectionHeader):
			if bytes.EqualFold(value, []byte("close")) {
				r.keepAlive = false
			} else if bytes.EqualFold(value, []byte("keep-alive")) {
				r.keepAlive = true
			}
		case bytes.EqualFold(name, headerIdempotencyKey):
			r.idem = value
		case bytes.EqualFold(name, bearerHeader):
			r.auth = value
		case bytes.EqualFold(name, transferEncodingHeader), bytes.EqualFold(name, expectHeader):
			return false
		}
	}
	return true
}

// deduct reads the body as the handler's scanner does and merges the
// Idempotency-Key header; false for a body it does not take or a request
// fasthttp answers 400.
func (r *loopRequest) deduct(body []byte) (engine.DeductRequest, bool) {
	f, ok := scanDeduct(body)
	if !ok {
		return engine.DeductRequest{}, false
	}
	user, requestID, qty, bad := f.check()
	if bad == nil && len(r.idem) > 0 {
		switch {
		case !validRequestID(r.idem):
			bad = bodyBadReqID
		case len(requestID) > 0 && string(r.idem) != string(requestID):
			bad = bodyBadIdemKey
		default:
			requestID = r.idem
		}
	}
	if bad != nil {
		return engine.DeductRequest{}, false
	}
	return engine.DeductRequest{SKU: r.sku, User: user, RequestID: requestID, Qty: qty, NoWait: r.noWait}, true
}

// start hands req to the engine: answered at once, or in flight until
// finish.
func (l *deductLoop) start(c *loopConn, req *engine.DeductRequest, closeAfter bool) {
	c.start = l.wokeAt
	res := &c.res
	if l.eng.DeductAsync(req, res, c.settled) {
		c.answerResult(res, closeAfter)
		return
	}
	c.inflight, c.closeAfter = true, closeAfter
	l.mu.Lock()
	l.inflight++
	l.mu.Unlock()
}

// loopWait reads the query's wait argument as waitArg does; false for a
// query the loop leaves to fasthttp.
func loopWait(query []byte) (noWait, ok bool) {
	if bytes.ContainsAny(query, "%+") {
		return false, false // encoded: fasthttp decodes it
	}
	for len(query) > 0 {
		var kv []byte
		kv, query, _ = bytes.Cut(query, []byte{'&'})
		k, v, _ := bytes.Cut(kv, []byte{'='})
		if string(k) != "wait" {
			continue
		}
		// The first wait counts, as fasthttp's Peek reads it.
		switch string(v) {
		case "", "commit":
			return false, true
		case "none":
			return true, true
		}
		return false, false
	}
	return false, true
}

// authorized is service() for the loop: the service or admin token when
// one is set.
func (l *deductLoop) authorized(header []byte) bool {
	cfg := l.s.cfg
	if cfg.ServiceToken == "" {
		return true
	}
	token, ok := bytes.CutPrefix(header, bearerPrefix)
	return ok && (subtle.ConstantTimeCompare(token, []byte(cfg.ServiceToken)) == 1 ||
		(cfg.AdminToken != "" && subtle.ConstantTimeCompare(token, []byte(cfg.AdminToken)) == 1))
}

// finish writes the answer from the ledger, on the goroutine that settled
// it, and has the loop serve what the client sent meanwhile.
func (c *loopConn) finish(r *engine.DeductResult) {
	l := c.l
	c.mu.Lock()
	more := false
	if !c.closed {
		c.inflight = false
		c.answerResult(r, c.closeAfter)
		if !c.flush() {
			syscall.Shutdown(c.fd, syscall.SHUT_RDWR) // the loop sees the hang-up and drops c
		} else if c.paused || len(c.in) > 0 {
			more = true // the loop reads on (or sees the close), and serves what it has
		}
	}
	c.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	if more {
		l.resumed = append(l.resumed, c)
		if len(l.resumed) == 1 {
			l.signal()
		}
	}
	if l.stopping && l.inflight == 0 && l.idle != nil {
		select {
		case <-l.idle:
		default:
			close(l.idle)
		}
	}
}

func (c *loopConn) answerResult(r *engine.DeductResult, closeAfter bool) {
	c.l.served.Add(1)
	code, body, retryAfter := deductAnswer(r, c.body[:0])
	c.answer(code, body, retryAfter, closeAfter)
	c.l.s.latency.observe(c.start)
}

// answer appends a response to c.out, as fasthttp would write it. Under
// c.mu.
func (c *loopConn) answer(code int, body []byte, retryAfter int64, closeAfter bool) {
	o := append(c.out, "HTTP/1.1 "...)
	o = strconv.AppendInt(o, int64(code), 10)
	o = append(o, ' ')
	o = append(o, fasthttp.StatusMessage(code)...)
	o = append(o, "\r\nServer: stockd\r\nContent-Type: application/json\r\nContent-Length: "...)
	o = strconv.AppendInt(o, int64(len(body)), 10)
	if retryAfter > 0 {
		o = append(o, "\r\nRetry-After: "...)
		o = strconv.AppendInt(o, retryAfter, 10)
	}
	if closeAfter {
		o = append(o, "\r\nConnection: close"...)
		c.close = true
	}
	o = append(o, "\r\n\r\n"...)
	c.out = append(o, body...)
}
