package eventloop

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
)

// loopMaxHead bounds a request head the loop reads: fasthttp's read
// buffer, which bounds the heads it takes (a longer one is answered 400
// there). A longer head, and every request the loop does not serve
// itself, goes to fasthttp with its connection.
const loopMaxHead = 4096

// loopMaxOut bounds the answers a connection's client has not taken: past
// it the loop reads no more of its pipelined requests until it does.
const loopMaxOut = 64 << 10

// Loop serves the single deduct (POST /v1/skus/{sku}/deduct) on one
// goroutine for every connection, the way Redis serves its clients: it
// parks in Go's scheduler on an epoll set of its own, reads each ready
// connection, and hands the deduct to the engine without waiting for the
// ledger; the goroutine that settles the take writes the answer. A
// connection whose request is anything else (another route, a body the
// quick scan does not take, chunked, Expect, a bad or missing token) is
// handed over, with the bytes read so far, to the fasthttp server, which
// serves it from then on: the contract is fasthttp's everywhere, the loop
// only takes the common request off its goroutines.
type Loop struct {
	cfg   Config
	eng   AsyncDeducter
	ln    *net.TCPListener
	lfd   int
	epfd  int
	efd   int // eventfd: wakes the loop (resumed connections, sweeps, stop)
	f     *os.File
	conns map[int]*loopConn // the loop goroutine's
	// wokeAt is when the loop's epoll wait last returned (the loop
	// goroutine's): the time a request read in that round arrived, for
	// its latency and its connection's idle clock, with one clock read
	// a round instead of two a request.
	wokeAt time.Time
	nextID atomic.Uint32
	logger *slog.Logger

	// The loop goroutine's, reused from one request to the next: the
	// head's parse, and the deduct reader (what it reads points into req
	// and c.in until the next request).
	req    fasthttp.Request
	br     *bufio.Reader
	head   bytes.Reader
	reader deductwire.Reader

	open    atomic.Int64  // connections the loop holds
	served  atomic.Uint64 // deducts it answered
	handovs atomic.Uint64 // connections it handed to fasthttp

	handed    chan net.Conn // connections for fasthttp
	closed    chan struct{} // the listener closed
	closeOnce sync.Once
	lnOnce    sync.Once
	done      chan struct{} // the loop ended

	mu       sync.Mutex
	resumed  []*loopConn
	sweep    bool
	stopping bool          // Shutdown began
	stop     bool          // the loop is to end
	ended    bool          // it ended: its descriptors are closed
	inflight int           // deducts awaiting the ledger
	idle     chan struct{} // closed when inflight falls to 0 while stopping
}

type loopConn struct {
	l    *Loop
	fd   int
	hint uint32

	mu       sync.Mutex
	in       []byte
	out      []byte
	body     []byte // scratch for an answer's body
	inflight bool
	closed   bool
	close    bool // close once out is written
	handoff  bool // hand over to fasthttp once out is written
	paused   bool // EPOLLIN off while an answer is in flight
	wantOut  bool
	lastRead time.Time
	outSince time.Time // when a write of out first met a full socket; zero while out drains at once
	start    time.Time // the request in flight's
	// closeAfter: close once the answer in flight is written. settled is
	// finish as the engine's callback, made once for the connection
	// rather than a closure a deduct.
	closeAfter bool
	settled    func(*engine.DeductResult)
	// req and res are the deduct being started and its answer when it
	// is known at once: the loop goroutine's, reused from one request to
	// the next (the engine keeps neither once DeductAsync returns), so
	// that neither is an allocation a deduct.
	req engine.DeductRequest
	res engine.DeductResult
}

// Available says whether Serve can run here (it needs epoll): the loop
// is on by default where it can be.
const Available = true

// Serve takes over accepting on ln: the loop serves plain deducts itself
// and returns the listener the fasthttp server is to serve (wrapped as
// the node wraps its listener), on which every other connection arrives.
// Plain HTTP only. Serve that listener, and stop the loop with Shutdown
// after the fasthttp server.
func Serve(ln *net.TCPListener, cfg Config) (*Loop, net.Listener, error) {
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	l := &Loop{cfg: cfg, eng: cfg.Engine, ln: ln, conns: make(map[int]*loopConn),
		handed: make(chan net.Conn, 1024), closed: make(chan struct{}), done: make(chan struct{}),
		br: newHeadReader()}
	l.logger = cfg.Logger.With("component", "http-event-loop")
	if err := rc.Control(func(fd uintptr) { l.lfd = int(fd) }); err != nil {
		return nil, nil, err
	}
	if l.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("http: epoll: %w", err)
	}
	efd, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		syscall.Close(l.epfd)
		return nil, nil, fmt.Errorf("http: eventfd: %w", errno)
	}
	l.efd = int(efd)
	for _, fd := range []int{l.lfd, l.efd} {
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}); err != nil {
			l.closeFDs()
			return nil, nil, fmt.Errorf("http: epoll: %w", err)
		}
	}
	// The loop waits in Go's scheduler, not in a blocking epoll_wait: the
	// epoll descriptor is itself pollable. A thread blocked in a system
	// call would cost a hand-off of its P at each wake.
	if err := syscall.SetNonblock(l.epfd, true); err != nil {
		l.closeFDs()
		return nil, nil, err
	}
	l.f = os.NewFile(uintptr(l.epfd), "deduct-loop-epoll")
	epc, err := l.f.SyscallConn()
	if err != nil {
		l.closeFDs()
		return nil, nil, err
	}
	go l.run(epc)
	go l.tick()
	l.logger.Info("serving plain deducts on an event loop", "addr", ln.Addr().String())
	return l, handoverListener{l}, nil
}

func (l *Loop) closeFDs() {
	if l.f != nil {
		l.f.Close()
	} else {
		syscall.Close(l.epfd)
	}
	syscall.Close(l.efd)
}

// wake runs set under l.mu and wakes the loop.
func (l *Loop) wake(set func(*Loop)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set(l)
	l.signal()
}

// signal wakes the loop. Under l.mu.
func (l *Loop) signal() {
	if !l.ended {
		one := [8]byte{1}
		syscall.Write(l.efd, one[:])
	}
}

// tick asks the loop to sweep idle and stalled connections once a second.
func (l *Loop) tick() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			l.wake(func(l *Loop) { l.sweep = true })
		}
	}
}

// Shutdown waits until no deduct of the loop awaits the ledger (or ctx
// ends), then closes its connections and ends it.
func (l *Loop) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.stopping = true
	if l.idle == nil {
		l.idle = make(chan struct{})
		if l.inflight == 0 {
			close(l.idle)
		}
	}
	idle := l.idle
	l.mu.Unlock()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = fmt.Errorf("deducts still awaiting the ledger: %w", ctx.Err())
	}
	l.wake(func(l *Loop) { l.stop = true })
	<-l.done
	return err
}

func (l *Loop) run(epc syscall.RawConn) {
	defer close(l.done)
	defer func() {
		l.mu.Lock()
		l.closeListener()
		l.ended = true
		l.closeFDs()
		l.mu.Unlock()
	}()
	events := make([]syscall.EpollEvent, 256)
	var n int
	var werr error
	wait := func(uintptr) bool {
		n, werr = syscall.EpollWait(l.epfd, events, 0)
		return n != 0 || (werr != nil && werr != syscall.EINTR)
	}
	scratch := make([]byte, 8)
	for {
		if err := epc.Read(wait); err != nil || (werr != nil && werr != syscall.EINTR) {
			l.logger.Error("deduct loop stopped", "err", cmp.Or(err, werr))
			l.dropAll()
			return
		}
		l.wokeAt = time.Now()
		for _, ev := range events[:n] {
			switch fd := int(ev.Fd); fd {
			case l.lfd:
				l.accept()
			case l.efd:
				syscall.Read(l.efd, scratch)
				if l.woken() {
					l.dropAll()
					return
				}
			default:
				if c := l.conns[fd]; c != nil {
					l.ready(c, ev.Events)
				}
			}
		}
	}
}

// woken handles the loop's wake-ups; true when it is to end.
func (l *Loop) woken() bool {
	l.mu.Lock()
	resumed, sweep, stop := l.resumed, l.sweep, l.stop
	l.resumed, l.sweep = nil, false
	l.mu.Unlock()
	select {
	case <-l.closed:
		l.closeListener()
	default:
	}
	for _, c := range resumed {
		c.mu.Lock()
		if !c.closed {
			l.process(c)
		}
		c.mu.Unlock()
	}
	if sweep {
		l.sweepConns()
	}
	return stop
}

func (l *Loop) accept() {
	for {
		select {
		case <-l.closed:
			return
		default:
		}
		nfd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or the listener closed
		}
		_ = syscall.SetsockoptInt(nfd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		c := &loopConn{l: l, fd: nfd, hint: l.nextID.Add(1), in: make([]byte, 0, 512), body: make([]byte, 0, 512), lastRead: l.wokeAt}
		c.settled = c.finish
		if len(l.conns) >= l.cfg.MaxConns {
			// fasthttp applies the limit and answers.
			c.mu.Lock()
			l.handOver(c)
			c.mu.Unlock()
			continue
		}
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, nfd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(nfd)}); err != nil {
			syscall.Close(nfd)
			continue
		}
		l.conns[nfd] = c
		l.open.Add(1)
	}
}

// WriteMetrics appends the loop's metrics in the Prometheus text format.
func (l *Loop) WriteMetrics(w *bytes.Buffer) {
	metrics.WriteGaugeUint64(w, "stockd_http_event_loop_connections", uint64(max(l.open.Load(), 0)))
	metrics.WriteCounterUint64(w, "stockd_http_event_loop_deducts_total", l.served.Load())
	metrics.WriteCounterUint64(w, "stockd_http_event_loop_handovers_total", l.handovs.Load())
}

// ready handles a connection's epoll events.
func (l *Loop) ready(c *loopConn, events uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if events&syscall.EPOLLOUT != 0 && len(c.out) > 0 {
		if !c.flush() {
			l.drop(c)
			return
		}
		if len(c.out) == 0 && !c.inflight && !c.close {
			// Written out: serve what waited behind it (and read on).
			l.process(c)
			return
		}
	}
	if c.handoff {
		return
	}
	if events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 {
		return
	}
	if c.close {
		if len(c.out) == 0 {
			l.drop(c)
		}
		return
	}
	if c.inflight {
		// Pipelined bytes (or a half-close) wait in the socket until the
		// answer is out.
		if events&(syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
			l.drop(c)
			return
		}
		c.setEvents(false, c.wantOut)
		return
	}
	if len(c.in) == cap(c.in) {
		c.in = append(c.in, make([]byte, cap(c.in))...)[:len(c.in)]
	}
	n, err := syscall.Read(c.fd, c.in[len(c.in):cap(c.in)])
	if err == syscall.EAGAIN {
		return
	}
	if n <= 0 {
		l.drop(c)
		return
	}
	c.in = c.in[:len(c.in)+n]
	c.lastRead = l.wokeAt
	l.process(c)
}

// drop closes c. The loop's, under c.mu.
func (l *Loop) drop(c *loopConn) {
	if c.closed {
		return
	}
	c.closed = true
	syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
	syscall.Close(c.fd)
	delete(l.conns, c.fd)
	l.open.Add(-1)
}

func (l *Loop) dropAll() {
	for _, c := range l.conns {
		c.mu.Lock()
		l.drop(c)
		c.mu.Unlock()
	}
}

// sweepConns closes connections idle past the idle timeout, those part
// way through a request past the read timeout, and those whose answer
// has not been taken past the write timeout.
func (l *Loop) sweepConns() {
	now := time.Now()
	cfg := l.cfg
	for _, c := range l.conns {
		c.mu.Lock()
		switch {
		case len(c.out) > 0 && !c.outSince.IsZero() && now.Sub(c.outSince) > cfg.WriteTimeout,
			!c.inflight && len(c.out) == 0 && len(c.in) > 0 && now.Sub(c.lastRead) > cfg.ReadTimeout,
			!c.inflight && len(c.out) == 0 && len(c.in) == 0 && now.Sub(c.lastRead) > cfg.IdleTimeout:
			l.drop(c)
		}
		c.mu.Unlock()
	}
}

// setEvents sets c's epoll interest. Under c.mu.
func (c *loopConn) setEvents(in, out bool) {
	ev := uint32(0)
	if in {
		ev |= syscall.EPOLLIN | syscall.EPOLLRDHUP
	}
	if out {
		ev |= syscall.EPOLLOUT
	}
	c.paused, c.wantOut = !in, out
	syscall.EpollCtl(c.l.epfd, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: ev, Fd: int32(c.fd)})
}

// flush writes out; false on a broken connection. Under c.mu.
func (c *loopConn) flush() bool {
	for len(c.out) > 0 {
		n, err := syscall.Write(c.fd, c.out)
		if err == syscall.EAGAIN {
			if c.outSince.IsZero() {
				c.outSince = time.Now()
			}
			if !c.wantOut {
				c.setEvents(!c.paused, true)
			}
			return true
		}
		if err != nil || n <= 0 {
			return false
		}
		c.out = c.out[:copy(c.out, c.out[n:])]
	}
	c.outSince = time.Time{}
	if c.wantOut {
		c.setEvents(!c.paused, false)
	}
	if c.close {
		syscall.Shutdown(c.fd, syscall.SHUT_WR)
	}
	return true
}

// process serves the complete requests in c.in while none is in flight,
// and hands c over at the first it does not serve. The loop's, under
// c.mu.
func (l *Loop) process(c *loopConn) {
	if c.handoff {
		if len(c.out) == 0 {
			l.handOver(c)
		}
		return
	}
	for !c.inflight && !c.close && len(c.in) > 0 && len(c.out) < loopMaxOut {
		n, serve := l.parse(c)
		if n == 0 {
			if serve {
				break // incomplete
			}
			if !c.flush() {
				l.drop(c)
				return
			}
			if len(c.out) > 0 {
				// The answers before it are still being written: the
				// hand-over waits for them (ready).
				c.handoff = true
				c.setEvents(false, true)
				return
			}
			l.handOver(c)
			return
		}
		c.in = c.in[:copy(c.in, c.in[n:])]
	}
	if !c.flush() {
		l.drop(c)
		return
	}
	// Stop reading a client that does not read its answers, at
	// loopMaxOut of them unwritten; read on once they are written and
	// none is in flight. (Reading stops while one is in flight only when
	// the client sends more meanwhile, in ready: an epoll_ctl on every
	// deduct cost a tenth of the loop's CPU.)
	switch full := len(c.out) >= loopMaxOut; {
	case full && !c.paused:
		c.setEvents(false, true)
	case !full && c.paused && !c.inflight:
		c.setEvents(true, c.wantOut)
	}
}
