package raftnode

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Every raft connection of a node that belongs to a restored cluster (its
// ledger has an identity, raftfsm.Ledger.ClusterID) opens with a line
// naming that identity:
//
//	STOCKD-CLUSTER <id>\n
//
// A node with an identity serves a connection only when it opens with its
// own; a connection without the line (raft's RPCs start with a byte below
// 8) or with another identity is closed before raft reads a byte of it,
// and logged. A node without an identity (a cluster never restored, or a
// new node about to join one) sends no line and takes any connection, so
// such clusters and older versions keep speaking plain raft.
const (
	clusterPreamble = "STOCKD-CLUSTER "
	// clusterPreambleMax bounds the line a node reads.
	clusterPreambleMax = len(clusterPreamble) + 128
	// clusterPreambleWait bounds the wait for it.
	clusterPreambleWait = 5 * time.Second
)

// errOtherCluster is a connection of another cluster.
var errOtherCluster = errors.New("a raft connection of another cluster")

// identityLayer carries the cluster's identity on every raft connection
// of inner.
type identityLayer struct {
	inner  raft.StreamLayer
	id     func() string
	logger *slog.Logger
}

// Dial opens a connection and names this node's cluster on it.
func (l *identityLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := l.inner.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	if id := l.id(); id != "" {
		c.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(clusterPreamble + id + "\n")); err != nil {
			c.Close()
			return nil, err
		}
		c.SetWriteDeadline(time.Time{})
	}
	return c, nil
}

// Accept returns the next connection; its first read checks the cluster
// it names (not here: one slow peer must not hold up the accept loop).
func (l *identityLayer) Accept() (net.Conn, error) {
	c, err := l.inner.Accept()
	if err != nil {
		return nil, err
	}
	return &identityConn{Conn: c, layer: l}, nil
}

func (l *identityLayer) Close() error   { return l.inner.Close() }
func (l *identityLayer) Addr() net.Addr { return l.inner.Addr() }

// identityConn checks the peer's cluster before its first byte reaches
// raft.
type identityConn struct {
	net.Conn
	layer   *identityLayer
	once    sync.Once
	checked error
	br      *bufio.Reader
}

func (c *identityConn) Read(p []byte) (int, error) {
	c.once.Do(func() { c.checked = c.check() })
	if c.checked != nil {
		return 0, c.checked
	}
	return c.br.Read(p)
}

// check reads the peer's preamble, if any, and decides.
func (c *identityConn) check() error {
	c.br = bufio.NewReaderSize(c.Conn, 4096)
	own := c.layer.id()
	c.Conn.SetReadDeadline(time.Now().Add(clusterPreambleWait))
	defer c.Conn.SetReadDeadline(time.Time{})
	first, err := c.br.Peek(1)
	if err != nil {
		return err
	}
	said := ""
	if first[0] == clusterPreamble[0] {
		line, err := c.br.ReadSlice('\n')
		if err != nil || len(line) > clusterPreambleMax || !strings.HasPrefix(string(line), clusterPreamble) {
			return c.refuse(own, "", "a malformed cluster line")
		}
		said = strings.TrimSuffix(string(line[len(clusterPreamble):]), "\n")
	}
	if own != "" && said != own {
		reason := "it names no cluster"
		if said != "" {
			reason = "it names cluster " + said
		}
		return c.refuse(own, said, reason)
	}
	return nil
}

func (c *identityConn) refuse(own, said, reason string) error {
	c.layer.logger.Warn("refused a raft connection of another cluster", "peer_addr", c.Conn.RemoteAddr().String(), "reason", reason, "cluster", own)
	c.Conn.Close()
	return fmt.Errorf("%w: %s (this node's cluster is %q)", errOtherCluster, reason, own)
}

// tcpLayer is raft's plain TCP stream layer: a listener, and dials of the
// peers' addresses.
type tcpLayer struct {
	ln        net.Listener
	advertise net.Addr
}

func newTCPLayer(bind string, advertise net.Addr) (*tcpLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("listen for raft on %s: %w", bind, err)
	}
	l := &tcpLayer{ln: ln, advertise: advertise}
	if l.advertise == nil {
		l.advertise = ln.Addr()
	}
	if a, ok := l.advertise.(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft address %s is not one peers can dial: give -raft a host, or advertise one", l.advertise)
	}
	return l, nil
}

func (l *tcpLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

func (l *tcpLayer) Accept() (net.Conn, error) { return l.ln.Accept() }
func (l *tcpLayer) Close() error              { return l.ln.Close() }
func (l *tcpLayer) Addr() net.Addr            { return l.advertise }
