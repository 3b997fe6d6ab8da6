package nodetest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"stockd.dev/stockd/raftnode"
	"sync"
	"time"
)

// faultNet carries raft and forwarding traffic between in-process nodes
// over real loopback TCP, and breaks it on demand: a node isolated, links
// between groups cut (a partition), every write delayed, connections
// dropped at random (what loss does to TCP), a node stalled (its traffic
// held until it resumes). Clients (the test's buyers) are not affected,
// as a real partition between servers would not cut a node off from a
// load balancer on its side.
type FaultNet struct {
	mu       sync.Mutex
	isolated map[string]bool
	cut      map[[2]string]bool       // both directions of a cut link
	stalled  map[string]chan struct{} // closed when the node resumes
	delay    time.Duration            // added to every write between nodes, with up to as much again of jitter
	dropRate float64                  // chance that a write closes its connection instead
	rng      *rand.Rand
	owner    map[string]string // listen address -> node id
	conns    map[*faultConn]bool
}

func NewFaultNet() *FaultNet {
	return &FaultNet{isolated: map[string]bool{}, cut: map[[2]string]bool{}, stalled: map[string]chan struct{}{},
		rng: rand.New(rand.NewPCG(1, 2)), owner: map[string]string{}, conns: map[*faultConn]bool{}}
}

// Own records that addr belongs to node id.
func (f *FaultNet) Own(addr, id string) {
	f.mu.Lock()
	f.owner[addr] = id
	f.mu.Unlock()
}

func (f *FaultNet) Isolate(id string) {
	f.mu.Lock()
	f.isolated[id] = true
	f.mu.Unlock()
	f.closeBroken()
}

func (f *FaultNet) Heal(id string) {
	f.mu.Lock()
	delete(f.isolated, id)
	f.mu.Unlock()
}

// partition cuts every link between nodes of different groups; nodes in
// no group keep all their links.
func (f *FaultNet) Partition(groups ...[]string) {
	f.mu.Lock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					f.cut[[2]string{a, b}], f.cut[[2]string{b, a}] = true, true
				}
			}
		}
	}
	f.mu.Unlock()
	f.closeBroken()
}

// degrade delays every write between nodes by d (plus jitter up to d) and
// drops connections with probability rate per write.
func (f *FaultNet) Degrade(d time.Duration, rate float64) {
	f.mu.Lock()
	f.delay, f.dropRate = d, rate
	f.mu.Unlock()
}

// stall holds every write from or to id until resume(id).
func (f *FaultNet) Stall(id string) {
	f.mu.Lock()
	if f.stalled[id] == nil {
		f.stalled[id] = make(chan struct{})
	}
	f.mu.Unlock()
}

func (f *FaultNet) Resume(id string) {
	f.mu.Lock()
	if ch := f.stalled[id]; ch != nil {
		close(ch)
		delete(f.stalled, id)
	}
	f.mu.Unlock()
}

// healAll ends every fault.
func (f *FaultNet) HealAll() {
	f.mu.Lock()
	clear(f.isolated)
	clear(f.cut)
	for id, ch := range f.stalled {
		close(ch)
		delete(f.stalled, id)
	}
	f.delay, f.dropRate = 0, 0
	f.mu.Unlock()
}

// brokenLocked reports whether traffic from one node to another is cut.
func (f *FaultNet) brokenLocked(from, to string) bool {
	return f.isolated[from] || f.isolated[to] || f.cut[[2]string{from, to}]
}

// closeBroken closes the open connections of links that are now cut.
func (f *FaultNet) closeBroken() {
	f.closeWhere(func(c *faultConn) bool { return f.brokenLocked(c.from, c.to) })
}

// closeWhere closes the open connections doomed says to (doomed runs
// with f.mu held).
func (f *FaultNet) closeWhere(doomed func(*faultConn) bool) {
	f.mu.Lock()
	var closing []*faultConn
	for c := range f.conns {
		if doomed(c) {
			closing = append(closing, c)
		}
	}
	f.mu.Unlock()
	for _, c := range closing {
		c.Close()
	}
}

// closeNode closes every connection from or to node id, as the kernel
// does when its process dies: an in-process node that stops leaves the
// connections its raft transport accepted open, with a goroutine each,
// and its peers' pooled connections to it half alive.
func (f *FaultNet) CloseNode(id string) {
	f.closeWhere(func(c *faultConn) bool { return c.from == id || c.to == id })
}

func (f *FaultNet) dial(from, addr string, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	to := f.owner[addr]
	cut := f.brokenLocked(from, to)
	f.mu.Unlock()
	if cut {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("link %s -> %s cut by the test", from, to)}
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, net: f, from: from, to: to, closed: make(chan struct{})}
	f.mu.Lock()
	f.conns[fc] = true
	f.mu.Unlock()
	return fc, nil
}

// httpDialer is a node's dialer for forwarding to peers.
func (f *FaultNet) HTTPDialer(from string) func(addr string) (net.Conn, error) {
	return func(addr string) (net.Conn, error) { return f.dial(from, addr, 3*time.Second) }
}

type faultConn struct {
	net.Conn
	net      *FaultNet
	from, to string
	once     sync.Once
	closed   chan struct{}
}

// Write applies the link's faults to what the dialing side sends: a cut
// or a drop closes the connection (both directions die with it), a stall
// holds the write until the node resumes, a delay sleeps first.
func (c *faultConn) Write(p []byte) (int, error) {
	f := c.net
	f.mu.Lock()
	stall := f.stalled[c.from]
	if stall == nil {
		stall = f.stalled[c.to]
	}
	broken := f.brokenLocked(c.from, c.to)
	drop := f.dropRate > 0 && f.rng.Float64() < f.dropRate
	var delay time.Duration
	if f.delay > 0 {
		delay = f.delay + time.Duration(f.rng.Int64N(int64(f.delay)))
	}
	f.mu.Unlock()
	if stall != nil {
		select {
		case <-stall:
			return c.Write(p) // the faults may have changed meanwhile
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	if broken || drop {
		c.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: fmt.Errorf("link %s -> %s broken by the test", c.from, c.to)}
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.once.Do(func() {
		c.net.mu.Lock()
		delete(c.net.conns, c)
		c.net.mu.Unlock()
		close(c.closed)
	})
	return c.Conn.Close()
}

// faultLayer is a raft stream layer over faultNet.
type faultLayer struct {
	net.Listener
	net  *FaultNet
	self string
}

var _ raftnode.StreamLayer = (*faultLayer)(nil)

func (l *faultLayer) Dial(address raftnode.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return l.net.dial(l.self, string(address), timeout)
}
