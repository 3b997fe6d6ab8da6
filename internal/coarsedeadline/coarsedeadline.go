// Package coarsedeadline gives a server's connections read and write
// deadlines that cost one atomic swap to set, instead of an update of a
// runtime timer each. fasthttp sets three deadlines a request when a
// server has read, write and idle timeouts; on the 2-core virtual
// machines stockd is measured on that was about a microsecond of a
// sold-out answer's ten.
//
// A Listener's connections keep their deadlines in atomics. One sweeper
// goroutine per listener looks at them every granularity: a connection
// whose deadline has passed gets a real deadline in the past, which ends
// a blocked Read or Write with os.ErrDeadlineExceeded as the real
// deadline would have, and fails the next one. So a deadline fires
// between its time and one granularity later. A deadline less than two
// granularities away (or already past) is set on the connection at once,
// exactly: those are interruptions, not timeouts.
//
// A Listener may also enforce a server's timeouts itself (Enforce), so
// that the server sets no deadline at all: a Read that waits for a new
// request ends after the idle timeout, one within a request after the
// read timeout counted from the request's first byte (the connection's
// first request from its accept), and a Write after the write timeout.
// Each is an atomic swap against the sweeper's last clock reading, not a
// clock read of its own, so these fire up to two granularities late. A deadline set by hand on a connection (a
// handler's, TLS's) takes that direction over from the timeout until it
// is cleared.
//
// The sweeper runs until the listener is closed and its last connection
// too (the sweeper itself bounds how long that takes).
//
// It imports nothing of ours.
package coarsedeadline

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultGranularity is how often a listener's sweeper runs unless told
// otherwise: timeouts of seconds may fire half a second late.
const DefaultGranularity = 500 * time.Millisecond

// realDeadline marks a direction whose deadline is set on the connection
// itself (fired by the sweeper, or set exactly because it was near).
const realDeadline = -1

// past is the real deadline the sweeper sets to fire a deadline.
var past = time.Unix(1, 0)

// Listener is a net.Listener whose connections have coarse deadlines.
// Accept and Close may be called from any goroutine.
type Listener struct {
	net.Listener
	granularity time.Duration
	// now is the sweeper's last reading of the clock (unix nanoseconds):
	// it tells a near deadline from a far one without reading the clock.
	now atomic.Int64

	// timeouts, when set (Enforce), apply to every connection.
	timeouts Timeouts

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wake   chan struct{} // the listener closed: sweep now, and end when no conn is left
	done   chan struct{} // the sweeper ended
}

// Wrap returns ln with coarse deadlines on its connections, swept every
// granularity (DefaultGranularity when <= 0), and starts its sweeper.
func Wrap(ln net.Listener, granularity time.Duration) *Listener {
	if granularity <= 0 {
		granularity = DefaultGranularity
	}
	l := &Listener{Listener: ln, granularity: granularity, conns: make(map[*conn]struct{}),
		wake: make(chan struct{}), done: make(chan struct{})}
	l.now.Store(time.Now().UnixNano())
	go l.sweep()
	return l
}

// Timeouts are a server's: how long a read within a request, a write,
// and a wait for the next request may take. A zero one is not enforced;
// a zero Idle takes Read's, as fasthttp's does.
type Timeouts struct {
	Read, Write, Idle time.Duration
}

// Enforce makes the listener's connections end reads and writes that take
// longer than t (see the package doc); the server then needs no timeouts
// of its own. Call it before the first Accept.
func (l *Listener) Enforce(t Timeouts) *Listener {
	if t.Idle <= 0 {
		t.Idle = t.Read
	}
	l.timeouts = t
	return l
}

// coarseNow is a time no earlier than now, without reading the clock: the
// sweeper's last reading plus its granularity. A timeout counted from it
// fires between its time and two granularities later, never early.
func (l *Listener) coarseNow() int64 { return l.now.Load() + int64(l.granularity) }

// Accept waits for the next connection and registers it with the sweeper.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &conn{Conn: c, l: l}
	if l.timeouts.Read > 0 {
		// The first request's read timeout runs from the accept.
		cc.request.Store(l.coarseNow() + int64(l.timeouts.Read))
	}
	l.mu.Lock()
	l.conns[cc] = struct{}{}
	l.mu.Unlock()
	return cc, nil
}

// Close closes the listener. Connections already accepted keep their
// deadlines: the sweeper goes on until the last of them is closed.
func (l *Listener) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.wake)
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// Conns is the number of open connections the sweeper watches.
func (l *Listener) Conns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Done closes when the sweeper has ended: the listener and every
// connection it accepted are closed.
func (l *Listener) Done() <-chan struct{} { return l.done }

func (l *Listener) sweep() {
	defer close(l.done)
	t := time.NewTicker(l.granularity)
	defer t.Stop()
	wake := l.wake
	for {
		select {
		case <-t.C:
		case <-wake:
			wake = nil // closed: from now on the ticks alone
		}
		now := time.Now().UnixNano()
		l.now.Store(now)
		l.mu.Lock()
		for c := range l.conns {
			c.expire(&c.read, now, c.Conn.SetReadDeadline)
			c.expire(&c.write, now, c.Conn.SetWriteDeadline)
		}
		end := l.closed && len(l.conns) == 0
		l.mu.Unlock()
		if end {
			return
		}
	}
}

// conn is an accepted connection with coarse deadlines. Its deadline
// words hold 0 (none), a deadline in unix nanoseconds, or realDeadline.
type conn struct {
	net.Conn
	l           *Listener
	read, write atomic.Int64
	// mu orders the real deadline's changes: the sweeper's firing and a
	// setter's undoing of it.
	mu     sync.Mutex
	closed atomic.Bool
	// request is the read deadline of the request being read (unix
	// nanoseconds), 0 between requests: a read then waits for the next
	// one, under the idle timeout. Used only with Enforce.
	request atomic.Int64
	// byHandRead and byHandWrite: a deadline set by hand holds that
	// direction, and the listener's timeouts leave it alone.
	byHandRead, byHandWrite atomic.Bool
}

// Read arms the read's deadline from the listener's timeouts, unless one
// was set by hand, then reads.
func (c *conn) Read(p []byte) (int, error) {
	t := &c.l.timeouts
	if t.Idle <= 0 {
		return c.Conn.Read(p)
	}
	if !c.byHandRead.Load() {
		d := c.request.Load()
		if d == 0 {
			d = c.l.coarseNow() + int64(t.Idle)
		}
		if err := c.setNanos(&c.read, d, c.Conn.SetReadDeadline); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 && t.Read > 0 && c.request.Load() == 0 {
		// A request's first bytes: it has the read timeout from now.
		c.request.Store(c.l.coarseNow() + int64(t.Read))
	}
	return n, err
}

// Write arms the write's deadline from the listener's timeouts, unless
// one was set by hand, then writes. A write is an answer: the next read
// waits for a new request.
func (c *conn) Write(p []byte) (int, error) {
	t := &c.l.timeouts
	if t.Idle <= 0 && t.Write <= 0 {
		return c.Conn.Write(p)
	}
	if c.request.Load() != 0 {
		c.request.Store(0)
	}
	if t.Write > 0 && !c.byHandWrite.Load() {
		if err := c.setNanos(&c.write, c.l.coarseNow()+int64(t.Write), c.Conn.SetWriteDeadline); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.byHandRead.Store(!t.IsZero())
	return c.set(&c.read, t, c.Conn.SetReadDeadline)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.byHandWrite.Store(!t.IsZero())
	return c.set(&c.write, t, c.Conn.SetWriteDeadline)
}

func (c *conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// set records deadline t in word. A near t is set on the connection at
// once; a far one is an atomic swap, plus clearing the real deadline when
// one was set before (a fired or a near deadline).
func (c *conn) set(word *atomic.Int64, t time.Time, real func(time.Time) error) error {
	if t.IsZero() {
		return c.setNanos(word, 0, real)
	}
	return c.setNanos(word, t.UnixNano(), real)
}

// setNanos is set with the deadline in unix nanoseconds (0: none).
func (c *conn) setNanos(word *atomic.Int64, ns int64, real func(time.Time) error) error {
	if ns != 0 && ns-c.l.now.Load() < 2*int64(c.l.granularity) {
		c.mu.Lock()
		defer c.mu.Unlock()
		word.Store(realDeadline)
		return real(time.Unix(0, ns))
	}
	if word.Load() == ns {
		return nil // armed already: the next read of the same request
	}
	if word.Swap(ns) != realDeadline {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A real deadline set since the swap (the sweeper firing this very
	// deadline, or a near one) is newer than this one: it stays.
	if word.Load() == realDeadline {
		return nil
	}
	return real(time.Time{})
}

// expire fires word's deadline when it has passed by now. Called by the
// sweeper with the listener's lock held.
func (c *conn) expire(word *atomic.Int64, now int64, real func(time.Time) error) {
	d := word.Load()
	if d <= 0 || d > now {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The swap to realDeadline fails when the deadline moved meanwhile.
	if word.CompareAndSwap(d, realDeadline) {
		_ = real(past) // fails only on a closed connection, which needs no deadline
	}
}

// Close closes the connection and stops watching it.
func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	}
	return c.Conn.Close()
}
