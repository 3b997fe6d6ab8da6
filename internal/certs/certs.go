// Package certs holds a node's TLS material as files on disk (a
// certificate and its key, a CA bundle) and serves it to TLS configs that
// always use the newest version: Reload re-reads every file, and a file
// that does not load leaves the version in use untouched. Handshakes that
// start after a Reload present and check the new material; connections
// already open keep theirs. It imports nothing of ours.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// Files names the PEM files of one identity. Cert and Key go together;
// CA may stand alone (a CA that only checks the other side).
type Files struct {
	Cert, Key, CA string
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// material is one loaded version of the files.
type material struct {
	pair   *tls.Certificate // nil without Cert
	leaf   *x509.Certificate
	pool   *x509.CertPool // nil without CA
	caLast time.Time      // the CA bundle's nearest expiry
}

// Store is one identity's material, reloadable. Safe for concurrent use.
type Store struct {
	name  string
	files Files
	cur   atomic.Pointer[material]
}

// Load reads files; name says what they are for in errors and metrics
// ("node", "http", "http-client-ca").
func Load(name string, files Files) (*Store, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, fmt.Errorf("%s certificate: give both the certificate and its key, or neither", name)
	}
	s := &Store{name: name, files: files}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Name is what the store is for.
func (s *Store) Name() string { return s.name }

// Reload reads every file again. On error the material in use stays.
func (s *Store) Reload() error {
	m, err := load(s.files)
	if err != nil {
		return fmt.Errorf("%s certificate: %w", s.name, err)
	}
	s.cur.Store(m)
	return nil
}

func load(f Files) (*material, error) {
	m := &material{}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("load %s and %s: %w", f.Cert, f.Key, err)
		}
		m.pair, m.leaf = &pair, pair.Leaf
		if m.leaf == nil {
			if m.leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
				return nil, fmt.Errorf("parse %s: %w", f.Cert, err)
			}
		}
	}
	if f.CA != "" {
		b, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		if m.pool, m.caLast, err = parsePool(b); err != nil {
			return nil, fmt.Errorf("CA bundle %s: %w", f.CA, err)
		}
	}
	return m, nil
}

// parsePool reads every certificate of a PEM bundle.
func parsePool(b []byte) (*x509.CertPool, time.Time, error) {
	pool := x509.NewCertPool()
	var nearest time.Time
	n := 0
	for {
		var block []byte
		block, b = nextCertificate(b)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block)
		if err != nil {
			return nil, time.Time{}, err
		}
		pool.AddCert(c)
		if n == 0 || c.NotAfter.Before(nearest) {
			nearest = c.NotAfter
		}
		n++
	}
	if n == 0 {
		return nil, time.Time{}, errors.New("no PEM certificate in it")
	}
	return pool, nearest, nil
}

// Leaf is the certificate in use (nil without one).
func (s *Store) Leaf() *x509.Certificate { return s.cur.Load().leaf }

// Pool is the CA bundle in use (nil without one).
func (s *Store) Pool() *x509.CertPool { return s.cur.Load().pool }

// Expiries is the expiry of the certificate in use and of the CA bundle's
// nearest, each zero when absent.
func (s *Store) Expiries() (cert, ca time.Time) {
	m := s.cur.Load()
	if m.leaf != nil {
		cert = m.leaf.NotAfter
	}
	return cert, m.caLast
}

func (s *Store) certificate() (*tls.Certificate, error) {
	if m := s.cur.Load(); m.pair != nil {
		return m.pair, nil
	}
	return nil, fmt.Errorf("%s: no certificate configured", s.name)
}

// ServerConfig serves the certificate in use. With a CA bundle in
// clientCAs and auth at least VerifyClientCertIfGiven, client
// certificates are checked against the bundle in use at each handshake;
// check, when set, then judges the verified client (its error refuses the
// handshake).
func (s *Store) ServerConfig(clientCAs *Store, auth tls.ClientAuthType, protos []string, check func(tls.ConnectionState) error) *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: protos}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: protos, ClientAuth: auth}
		pair, err := s.certificate()
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{*pair}
		if clientCAs != nil {
			c.ClientCAs = clientCAs.Pool()
		}
		if check != nil {
			c.VerifyConnection = check
		}
		return c, nil
	}
	return base
}

// ClientConfig dials as the certificate in use (if any) and checks the
// server's chain against roots' bundle in use at each handshake, and its
// SANs against serverName (the dialed host; "": the config's ServerName
// as the caller sets it), then check when set. Go's own verification is
// replaced by this one (it would fix the roots for the config's life).
func (s *Store) ClientConfig(roots *Store, proto, serverName string, check func(*x509.Certificate) error) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}
	if proto != "" {
		c.NextProtos = []string{proto}
	}
	if s != nil && s.Leaf() != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return s.certificate() }
	}
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if proto != "" && cs.NegotiatedProtocol != proto {
			return fmt.Errorf("the server does not speak %s (it offered %q)", proto, cs.NegotiatedProtocol)
		}
		leaf, err := VerifyChain(roots.Pool(), cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
		if err != nil {
			return err
		}
		name := serverName
		if name == "" {
			name = c.ServerName
		}
		if err := leaf.VerifyHostname(name); err != nil {
			return err
		}
		if check != nil {
			return check(leaf)
		}
		return nil
	}
	return c
}

// VerifyChain checks chain (leaf first) against roots for usage at the
// current time and returns the leaf.
func VerifyChain(roots *x509.CertPool, chain []*x509.Certificate, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("no certificate presented")
	}
	if roots == nil {
		return nil, errors.New("no CA bundle to check the certificate against")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return chain[0], err
}

// ServerName is the name to verify when dialing addr (its host).
func ServerName(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// nextCertificate returns the DER of the next CERTIFICATE block of a PEM
// bundle and what follows it (nil when none is left).
func nextCertificate(b []byte) ([]byte, []byte) {
	for {
		block, rest := pem.Decode(b)
		if block == nil {
			return nil, nil
		}
		if block.Type == "CERTIFICATE" {
			return block.Bytes, rest
		}
		b = rest
	}
}
