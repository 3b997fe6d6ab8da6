package eventloop

import (
	"bufio"
	"bytes"
	"syscall"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
)

// The loop's reading of a request and its answers. The loop frames
// requests itself (where a head ends, how long the body is) and reads the
// head with fasthttp's own parser into a fasthttp.Request; deductwire
// then reads the deduct from it and writes its answer, as it does for the
// handlers. Anything but a plain deduct is left to fasthttp (parse
// reports serve false), which reads it from the start.

var crlfcrlf = []byte("\r\n\r\n")

// parse serves the request at the head of c.in if it is a plain deduct:
// n is the bytes it took (0 with serve true: not complete yet; 0 with
// serve false: not one the loop serves). The loop goroutine's.
func (l *Loop) parse(c *loopConn) (n int, serve bool) {
	b := c.in
	end := bytes.Index(b, crlfcrlf)
	if end < 0 {
		return 0, len(b) < loopMaxHead
	}
	head := end + len(crlfcrlf)
	if head > loopMaxHead {
		return 0, false
	}
	req := &l.req
	req.Reset()
	l.head.Reset(b[:head])
	l.br.Reset(&l.head)
	if err := req.Header.Read(l.br); err != nil || !req.Header.IsPost() {
		return 0, false
	}
	sku, ok := deductwire.DeductSKU(req.URI().Path())
	// Framing the loop leaves to fasthttp: no Content-Length (or a
	// chunked body), one over the limit (answered 413 there), a client
	// that waits for 100 Continue.
	length := req.Header.ContentLength()
	if !ok || length < 0 || len(req.Header.Peek(fasthttp.HeaderContentLength)) == 0 ||
		length > deductwire.MaxBodyBytes || len(req.Header.Peek(fasthttp.HeaderExpect)) > 0 {
		return 0, false
	}
	n = head + length
	if len(b) < n {
		return 0, true
	}
	req.SetBodyRaw(b[head:n])
	// A refusal (401, 400) goes to fasthttp with its connection, where
	// the handler reads it with the same Reader and gives the same
	// answer: the loop keeps only the connections of buyers that send
	// what it serves.
	if !l.cfg.Credentials.Service(req.Header.Peek(fasthttp.HeaderAuthorization)) {
		return 0, false
	}
	if status, _ := l.reader.Read(req, sku, &c.req); status != 0 {
		return 0, false
	}
	c.req.Hint = c.hint
	l.start(c, &c.req, req.Header.ConnectionClose())
	return n, true
}

// start hands req to the engine: answered at once, or in flight until
// finish.
func (l *Loop) start(c *loopConn, req *engine.DeductRequest, closeAfter bool) {
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
	a := deductwire.Result(r, c.body[:0])
	c.answer(&a, closeAfter)
	if c.l.cfg.Observe != nil {
		c.l.cfg.Observe(c.start)
	}
}

// answer appends a to c.out, framed as fasthttp frames it. Under c.mu.
func (c *loopConn) answer(a *deductwire.Answer, closeAfter bool) {
	c.out = a.AppendHTTP(c.out, closeAfter)
	if closeAfter {
		c.close = true
	}
}

// newHeadReader is the buffered reader the loop reads heads through: a
// head is at most loopMaxHead, which fits in its buffer.
func newHeadReader() *bufio.Reader { return bufio.NewReaderSize(nil, loopMaxHead) }
