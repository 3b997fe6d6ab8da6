// Package nodeport is a node's one port for everything other nodes send
// it, when the cluster runs on node certificates: raft replication and
// the node-to-node HTTP calls (forwarded proposals, relayed client calls,
// status and read-index probes) share one TLS listener, told apart by the
// protocol each connection names in its handshake (ALPN). Every
// connection is mutually authenticated: the peer's certificate must be
// signed by the node CA in use, current, usable as a client, and name
// (its Common Name) a member of the cluster. A connection that fails any
// of these, or that is not TLS at all, is closed at the handshake and
// logged with the reason and the peer's address. Clients of the service
// never need this port.
package nodeport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/internal/certs"
)

// The protocols a node-port connection may name.
const (
	ProtoRaft = "stockd-raft/1"
	ProtoHTTP = "stockd-peer-http/1"
)

// handshakeTimeout bounds a connection's TLS handshake.
const handshakeTimeout = 5 * time.Second

// Members reports whether id is a member of the cluster, as this node
// knows it now.
type Members func(id string) bool

// Conn is an authenticated node-to-node connection: PeerID is the Common
// Name of the certificate the peer presented.
type Conn struct {
	*tls.Conn
	peer string
}

// PeerID is the node the connection's certificate names.
func (c *Conn) PeerID() string { return c.peer }

// Port is the node port: a TLS listener whose connections go to raft
// (RaftLayer) or to the node's peer HTTP server (HTTPListener).
type Port struct {
	ln        net.Listener
	advertise net.Addr
	id        string
	store     *certs.Store
	members   atomic.Pointer[Members]
	server    *tls.Config
	logger    *slog.Logger
	refused   atomic.Uint64

	raft, http *chanListener
	closeOnce  sync.Once
	done       chan struct{}
}

// Listen opens the node port on bind, presenting store's certificate and
// checking peers against its CA bundle. advertise is the address peers
// dial (it must be in every peer's reach and in this node's SANs).
// SetMembers must be called before peers are let in: until then every
// connection is refused.
func Listen(bind, advertise, id string, store *certs.Store, logger *slog.Logger) (*Port, error) {
	if store.Leaf() == nil || store.Pool() == nil {
		return nil, errors.New("node port: a node certificate, its key and the node CA are all needed")
	}
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("node port: advertise address %q: %w", advertise, err)
	}
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, fmt.Errorf("node port: advertise address %q is not dialable: give the address peers reach this node at", advertise)
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("node port: listen on %s: %w", bind, err)
	}
	// The address is advertised as given, a host name kept a host name:
	// peers check this node's certificate against the host they dial, and
	// a certificate names the host, not the address it resolves to today
	// (a container's, say).
	host, port, _ := net.SplitHostPort(advertise)
	if adv.Port == 0 { // bound to port 0 (tests): advertise the port it got
		port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	named := hostAddr(net.JoinHostPort(host, port))
	p := &Port{ln: ln, advertise: named, id: id, store: store, logger: logger, done: make(chan struct{})}
	p.raft, p.http = newChanListener(p, named), newChanListener(p, ln.Addr())
	p.server = store.ServerConfig(store, tls.RequireAndVerifyClientCert, []string{ProtoRaft, ProtoHTTP}, p.checkClient)
	go p.accept()
	return p, nil
}

// SetMembers installs the membership check.
func (p *Port) SetMembers(m Members) { p.members.Store(&m) }

// Addr is the address the port is bound to.
func (p *Port) Addr() net.Addr { return p.ln.Addr() }

// Refused counts the connections refused at the handshake.
func (p *Port) Refused() uint64 { return p.refused.Load() }

// checkClient judges a peer whose chain Go has verified against the node
// CA: it must be a node certificate (the serverAuth usage, which `stockd
// cert node` gives and `stockd cert client` does not: a client
// certificate signed by the same CA never passes as a node), and name a
// member.
func (p *Port) checkClient(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if !nodeCertificate(leaf) {
		return fmt.Errorf("the certificate naming %q is not a node certificate: it lacks the serverAuth usage (a client certificate signed by the node CA)", leaf.Subject.CommonName)
	}
	return p.checkMember(leaf.Subject.CommonName)
}

// nodeCertificate reports whether c may serve as a node: it carries the
// serverAuth usage, or any usage, or names no extended usage at all (as
// an openssl certificate made with nothing but a CN and SANs does, which
// X.509 leaves unrestricted). A certificate for clients only is none.
func nodeCertificate(c *x509.Certificate) bool {
	if len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny)
}

func (p *Port) checkMember(id string) error {
	m := p.members.Load()
	switch {
	case id == "":
		return errors.New("the certificate names no node (empty Common Name)")
	case m == nil:
		return errors.New("this node does not know its members yet")
	case !(*m)(id):
		return fmt.Errorf("node %q is not a member of this cluster", id)
	}
	return nil
}

func (p *Port) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
			default:
				p.logger.Error("node port: accept failed; the port is closed", "err", err)
			}
			p.raft.close()
			p.http.close()
			return
		}
		go p.handshake(c)
	}
}

// handshake authenticates one connection and hands it to raft or to HTTP.
func (p *Port) handshake(raw net.Conn) {
	tc := tls.Server(raw, p.server)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		p.refused.Add(1)
		p.logger.Warn("node port: refused a connection at the handshake", "peer_addr", raw.RemoteAddr().String(), "reason", err.Error())
		raw.Close()
		return
	}
	cs := tc.ConnectionState()
	conn := &Conn{Conn: tc, peer: cs.PeerCertificates[0].Subject.CommonName}
	switch cs.NegotiatedProtocol {
	case ProtoRaft:
		p.raft.push(conn)
	case ProtoHTTP:
		p.http.push(conn)
	default:
		p.refused.Add(1)
		p.logger.Warn("node port: refused a connection that names no protocol this node speaks", "peer_addr", raw.RemoteAddr().String(), "peer", conn.peer, "protocol", cs.NegotiatedProtocol)
		tc.Close()
	}
}

// Close closes the port and both of its listeners.
func (p *Port) Close() error {
	var err error
	p.closeOnce.Do(func() {
		close(p.done)
		err = p.ln.Close()
	})
	return err
}

// HTTPListener is the listener of node-to-node HTTP connections; each
// accepted net.Conn is a *Conn.
func (p *Port) HTTPListener() net.Listener { return p.http }

// RaftLayer is raft's stream layer over the port.
func (p *Port) RaftLayer() raft.StreamLayer { return raftLayer{p.raft, p} }

type raftLayer struct {
	*chanListener
	p *Port
}

func (l raftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return l.p.Dial(context.Background(), string(address), ProtoRaft, timeout)
}

// Dial opens an authenticated connection to the node port at addr for
// proto: the server's certificate must be signed by the node CA in use,
// name addr's host in its SANs and a member in its Common Name.
func (p *Port) Dial(ctx context.Context, addr, proto string, timeout time.Duration) (net.Conn, error) {
	host := certs.ServerName(addr)
	cfg := p.store.ClientConfig(p.store, proto, host, func(leaf *x509.Certificate) error {
		return p.checkMember(leaf.Subject.CommonName)
	})
	cfg.ServerName = host
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn)
	return &Conn{Conn: tc, peer: tc.ConnectionState().PeerCertificates[0].Subject.CommonName}, nil
}

// chanListener is a net.Listener fed by the port.
type chanListener struct {
	p      *Port
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener(p *Port, addr net.Addr) *chanListener {
	return &chanListener{p: p, addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *chanListener) close() { l.once.Do(func() { close(l.closed) }) }

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close closes this listener only; the port closes with Port.Close.
func (l *chanListener) Close() error { l.close(); return nil }

func (l *chanListener) Addr() net.Addr { return l.addr }

// hostAddr is a TCP address as it was given, host name and all.
type hostAddr string

func (a hostAddr) Network() string { return "tcp" }
func (a hostAddr) String() string  { return string(a) }
