package main

import (
	"fmt"
	"net"
	"sync"
	"time"

	"stockd/raftfsm"
)

// faultNet carries raft and forwarding traffic between in-process nodes
// over real loopback TCP, and can isolate a node: its dials fail and its
// open connections are closed, in both directions. Clients (the test's
// buyers) are not affected, as a real partition between servers would not
// cut a node off from a load balancer on its side.
type faultNet struct {
	mu       sync.Mutex
	isolated map[string]bool
	owner    map[string]string // listen address -> node id
	conns    map[*faultConn]bool
}

func newFaultNet() *faultNet {
	return &faultNet{isolated: map[string]bool{}, owner: map[string]string{}, conns: map[*faultConn]bool{}}
}

// own records that addr belongs to node id.
func (f *faultNet) own(addr, id string) {
	f.mu.Lock()
	f.owner[addr] = id
	f.mu.Unlock()
}

func (f *faultNet) isolate(id string) {
	f.mu.Lock()
	f.isolated[id] = true
	var doomed []*faultConn
	for c := range f.conns {
		if c.from == id || c.to == id {
			doomed = append(doomed, c)
		}
	}
	f.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

func (f *faultNet) heal(id string) {
	f.mu.Lock()
	delete(f.isolated, id)
	f.mu.Unlock()
}

func (f *faultNet) dial(from, addr string, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	to := f.owner[addr]
	cut := f.isolated[from] || f.isolated[to]
	f.mu.Unlock()
	if cut {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("link %s -> %s cut by the test", from, to)}
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, net: f, from: from, to: to}
	f.mu.Lock()
	f.conns[fc] = true
	f.mu.Unlock()
	return fc, nil
}

// httpDialer is a node's dialer for forwarding to peers.
func (f *faultNet) httpDialer(from string) func(addr string) (net.Conn, error) {
	return func(addr string) (net.Conn, error) { return f.dial(from, addr, 3*time.Second) }
}

type faultConn struct {
	net.Conn
	net      *faultNet
	from, to string
	once     sync.Once
}

func (c *faultConn) Close() error {
	c.once.Do(func() {
		c.net.mu.Lock()
		delete(c.net.conns, c)
		c.net.mu.Unlock()
	})
	return c.Conn.Close()
}

// faultLayer is a raft stream layer over faultNet.
type faultLayer struct {
	net.Listener
	net  *faultNet
	self string
}

var _ raftfsm.StreamLayer = (*faultLayer)(nil)

func (l *faultLayer) Dial(address raftfsm.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return l.net.dial(l.self, string(address), timeout)
}
