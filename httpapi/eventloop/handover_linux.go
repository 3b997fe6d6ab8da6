package eventloop

import (
	"bytes"
	"net"
	"os"
	"syscall"
)

// The hand-over: connections the loop does not serve go to the fasthttp
// server, through the listener it serves, with the bytes read so far.

// handoverListener is what fasthttp serves: the connections the loop
// hands over.
type handoverListener struct{ l *Loop }

func (h handoverListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.l.handed:
		return c, nil
	case <-h.l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting: the listener closes; the loop's connections
// stay until Shutdown.
// The listener itself is closed by the loop, the one user of its
// descriptor (a descriptor closed under it could be another socket by the
// time it accepts), or here once the loop has ended.
func (h handoverListener) Close() error {
	h.l.closeOnce.Do(func() {
		close(h.l.closed)
		h.l.mu.Lock()
		defer h.l.mu.Unlock()
		if h.l.ended {
			h.l.closeListener()
			return
		}
		h.l.signal()
	})
	return nil
}

// closeListener stops accepting and closes the listener, once: on the
// loop, or after it ended.
func (l *Loop) closeListener() {
	l.lnOnce.Do(func() {
		if !l.ended {
			syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, l.lfd, nil)
		}
		if err := l.ln.Close(); err != nil {
			l.logger.Warn("closing the http listener", "err", err)
		}
	})
}

func (h handoverListener) Addr() net.Addr { return h.l.ln.Addr() }

// handOver gives c, with what it has read, to fasthttp. The loop's, under
// c.mu, with nothing in flight or unwritten.
func (l *Loop) handOver(c *loopConn) {
	l.handovs.Add(1)
	if _, ok := l.conns[c.fd]; ok {
		syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
		delete(l.conns, c.fd)
		l.open.Add(-1)
	}
	c.closed = true
	f := os.NewFile(uintptr(c.fd), "")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		l.logger.Warn("could not hand a connection to the http server", "err", err)
		return
	}
	if len(c.in) > 0 {
		nc = &prefixedConn{Conn: nc, pre: bytes.Clone(c.in)}
	}
	select {
	case l.handed <- nc:
	case <-l.closed:
		nc.Close()
	}
}

// prefixedConn reads pre before its connection.
type prefixedConn struct {
	net.Conn
	pre []byte
}

func (p *prefixedConn) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
