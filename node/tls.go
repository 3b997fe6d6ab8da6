package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/internal/certs"
	"stockd.dev/stockd/internal/nodeport"
	"stockd.dev/stockd/raftnode"
)

// TLSFiles names a node's certificate files (PEM).
type TLSFiles struct {
	// NodeCert, NodeKey and NodeCA are the node's identity on every
	// node-to-node call (raft and HTTP, both on the node port): the
	// certificate's Common Name is the node's id; NodeCA signs every
	// member's certificate.
	NodeCert, NodeKey, NodeCA string
	// HTTPCert and HTTPKey turn the client listener into HTTPS;
	// HTTPClientCA, with them, requires a client certificate it signed
	// on every route but the probes.
	HTTPCert, HTTPKey, HTTPClientCA string
}

func (f TLSFiles) nodeFiles() certs.Files {
	return certs.Files{Cert: f.NodeCert, Key: f.NodeKey, CA: f.NodeCA}
}

func (f TLSFiles) httpFiles() certs.Files { return certs.Files{Cert: f.HTTPCert, Key: f.HTTPKey} }

// onNodeCerts reports whether the node runs on node certificates.
func (f TLSFiles) onNodeCerts() bool { return f.nodeFiles().Set() }

// certHowTo is what a refusal to start without node certificates says.
const certHowTo = "make certificates with `stockd cert ca -out certs`, then `stockd cert node -ca certs -id <id> -host <its addresses> -out certs` for each node, and start each with -node-cert certs/<id>.pem -node-key certs/<id>-key.pem -node-ca certs/ca.pem"

// transportProblem names the first transport setting that cannot work:
// node certificates half given, a cluster with neither certificates nor a
// secret, a raft address other machines reach without certificates.
func (c *Config) transportProblem() error {
	f := c.TLS
	nodeCerts := f.onNodeCerts()
	switch {
	case nodeCerts && (f.NodeCert == "" || f.NodeKey == "" || f.NodeCA == ""):
		return errors.New("node certificates need all three of -node-cert, -node-key and -node-ca")
	case (f.HTTPCert == "") != (f.HTTPKey == ""):
		return errors.New("HTTPS needs both -http-cert and -http-key")
	case f.HTTPClientCA != "" && f.HTTPCert == "":
		return errors.New("-http-client-ca checks client certificates over HTTPS: give -http-cert and -http-key too")
	case nodeCerts && c.ClusterSecret != "":
		return errors.New("-cluster-secret is for clusters without node certificates: with -node-cert the certificates prove who calls; drop the secret")
	case nodeCerts && c.StreamLayer != nil:
		return errors.New("node: a test stream layer and node certificates exclude each other")
	case !nodeCerts && (len(c.Peers) > 0 || c.Join != "") && c.ClusterSecret == "":
		return errors.New("a cluster (-peers or -join) needs node certificates (-node-cert, -node-key, -node-ca) or, on loopback, -cluster-secret (or STOCKD_CLUSTER_SECRET): the same secret on every node, for example from `openssl rand -hex 32`; node-to-node calls carry it")
	case !nodeCerts && !c.InsecurePlaintextCluster && c.StreamLayer == nil && !loopbackOnly(c.raftAdvertise()):
		return fmt.Errorf("-raft %s is reachable from other machines, so node-to-node traffic needs node certificates: %s; to run on plain TCP anyway pass -insecure-plaintext-cluster", c.raftAdvertise(), certHowTo)
	}
	return nil
}

// raftAdvertise is the raft address peers dial: this node's entry in
// Peers, else the advertised or bound raft address.
func (c *Config) raftAdvertise() string {
	for _, p := range c.Peers {
		if p.ID == c.ID {
			return p.Addr
		}
	}
	if c.Raft.Advertise != "" {
		return c.Raft.Advertise
	}
	return c.Raft.RaftBind
}

// nodeTLS is a node's loaded certificates and, on node certificates, its
// node port.
type nodeTLS struct {
	node, http, httpCA *certs.Store // each nil when not configured
	port               *nodeport.Port
	logger             *slog.Logger
}

// openTLS loads the configured certificates and opens the node port.
func openTLS(cfg *Config, logger *slog.Logger) (*nodeTLS, error) {
	t := &nodeTLS{logger: logger.With("component", "tls")}
	var err error
	if cfg.TLS.onNodeCerts() {
		if t.node, err = certs.Load("node", cfg.TLS.nodeFiles()); err != nil {
			return nil, err
		}
	}
	if cfg.TLS.HTTPCert != "" {
		if t.http, err = certs.Load("http", cfg.TLS.httpFiles()); err != nil {
			return nil, err
		}
	}
	if cfg.TLS.HTTPClientCA != "" {
		if t.httpCA, err = certs.Load("http-client-ca", certs.Files{CA: cfg.TLS.HTTPClientCA}); err != nil {
			return nil, err
		}
	}
	if t.node != nil {
		if t.port, err = nodeport.Listen(cfg.Raft.RaftBind, cfg.raftAdvertise(), cfg.ID, t.node, logger.With("component", "nodeport")); err != nil {
			return nil, err
		}
		t.logger.Info("node-to-node traffic on mutually authenticated TLS", "node_port", t.port.Addr().String(), "cn", t.node.Leaf().Subject.CommonName)
	} else if cfg.InsecurePlaintextCluster {
		logger.Warn("node-to-node traffic is plain TCP with the cluster secret on an address other machines may reach (-insecure-plaintext-cluster): anyone who reaches the raft port can speak raft to this node; " + certHowTo)
	}
	return t, nil
}

// clientListener wraps the HTTP listener in TLS when HTTPS is configured.
func (t *nodeTLS) clientListener(ln net.Listener) net.Listener {
	if t.http == nil {
		return ln
	}
	auth := tls.NoClientCert
	if t.httpCA != nil {
		auth = tls.VerifyClientCertIfGiven
	}
	return tls.NewListener(ln, t.http.ServerConfig(t.httpCA, auth, []string{"http/1.1"}, nil))
}

// peerDial is the peer HTTP client's way onto other nodes' node ports.
func (t *nodeTLS) peerDial(addr string) (net.Conn, error) {
	return t.port.Dial(context.Background(), addr, nodeport.ProtoHTTP, peerDialTimeout)
}

// peerDialTimeout bounds a dial and handshake to a peer's node port.
const peerDialTimeout = 3 * time.Second

// members is the node port's membership check: a member of raft's
// configuration, or anyone the node CA signed while this node has none
// yet (a node waiting to be joined learns its members from the leader
// that dials it).
func members(r *raftnode.Node) nodeport.Members {
	return func(id string) bool {
		ms, err := r.Members()
		if err != nil {
			return false
		}
		if len(ms) == 0 {
			return true
		}
		for _, m := range ms {
			if m.ID == id {
				return true
			}
		}
		return false
	}
}

// reload re-reads every certificate, key and CA file; a file that does
// not load keeps the one in use, and is named in the error.
func (t *nodeTLS) reload() error {
	var errs []error
	for _, s := range []*certs.Store{t.node, t.http, t.httpCA} {
		if s == nil {
			continue
		}
		if err := s.Reload(); err != nil {
			t.logger.Error("certificate reload failed; the one in use stays", "cert", s.Name(), "err", err)
			errs = append(errs, err)
			continue
		}
		cert, _ := s.Expiries()
		t.logger.Info("certificates reloaded", "cert", s.Name(), "not_after", cert)
	}
	return errors.Join(errs...)
}

// expiries lists every certificate in use and when it expires.
func (t *nodeTLS) expiries() []httpapi.CertExpiry {
	var out []httpapi.CertExpiry
	for _, s := range []*certs.Store{t.node, t.http, t.httpCA} {
		if s == nil {
			continue
		}
		cert, ca := s.Expiries()
		if !cert.IsZero() {
			out = append(out, httpapi.CertExpiry{Name: s.Name(), NotAfter: cert})
		}
		if !ca.IsZero() {
			name := s.Name() + "-ca"
			if s == t.httpCA {
				name = s.Name()
			}
			out = append(out, httpapi.CertExpiry{Name: name, NotAfter: ca})
		}
	}
	return out
}

func (t *nodeTLS) close() {
	if t != nil && t.port != nil {
		t.port.Close()
	}
}

// ReloadTLS re-reads the node's certificates, keys and CAs (SIGHUP): new
// handshakes use them, open connections keep theirs. A file that does
// not load keeps the one in use; the error names it.
func (n *Node) ReloadTLS() error {
	if n.tls == nil {
		return nil
	}
	return n.tls.reload()
}

// NodePortAddr is the node port's bound address ("" without node
// certificates).
func (n *Node) NodePortAddr() string {
	if n.tls == nil || n.tls.port == nil {
		return ""
	}
	return n.tls.port.Addr().String()
}

// joinTLS is how a joining node checks an HTTPS member it asks for
// membership: against the node CA (the member's -http-cert must be
// signed by it), presenting its node certificate. Nil without node
// certificates: the system's roots.
func (t *nodeTLS) joinTLS(joinURL string) *tls.Config {
	if t.node == nil {
		return nil
	}
	host := joinURL
	if u, err := url.Parse(joinURL); err == nil {
		host = u.Hostname()
	}
	return t.node.ClientConfig(t.node, "", host, nil)
}

// CheckConfig is `stockd serve -check-config`: cfg must pass Validate,
// and every certificate, key and CA file it names must load, with the
// node certificate's Common Name the node's id. It binds no port and
// touches no data dir.
func CheckConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if host, _, err := net.SplitHostPort(cfg.raftAdvertise()); err != nil || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		return fmt.Errorf("-raft %s: peers cannot dial %q; give -advertise-raft the address they reach this node at, or name it in -peers", cfg.Raft.RaftBind, cfg.raftAdvertise())
	}
	if cfg.TLS.onNodeCerts() {
		s, err := certs.Load("node", cfg.TLS.nodeFiles())
		if err != nil {
			return err
		}
		if cn := s.Leaf().Subject.CommonName; cn != cfg.ID {
			return fmt.Errorf("-node-cert %s names node %q, and this node is -id %s: a node's id is its certificate's Common Name", cfg.TLS.NodeCert, cn, cfg.ID)
		}
	}
	if cfg.TLS.HTTPCert != "" {
		if _, err := certs.Load("http", cfg.TLS.httpFiles()); err != nil {
			return err
		}
	}
	if cfg.TLS.HTTPClientCA != "" {
		if _, err := certs.Load("http-client-ca", certs.Files{CA: cfg.TLS.HTTPClientCA}); err != nil {
			return err
		}
	}
	return nil
}
