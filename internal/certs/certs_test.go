package certs_test

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stockd.dev/stockd/internal/certs"
	"stockd.dev/stockd/internal/pki"
)

// makeDir writes a CA and node certificates for ids (loopback SANs).
func makeDir(t *testing.T, ids ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := pki.Main([]string{"ca", "-out", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := pki.Main([]string{"node", "-ca", dir, "-id", id, "-host", "127.0.0.1", "-out", dir}, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func files(dir, id string) certs.Files {
	return certs.Files{Cert: filepath.Join(dir, id+".pem"), Key: filepath.Join(dir, id+"-key.pem"), CA: filepath.Join(dir, "ca.pem")}
}

func TestStore_ReloadKeepsWhatIsInUseWhenAFileIsBad(t *testing.T) {
	dir := makeDir(t, "n1", "n2")
	s, err := certs.Load("node", files(dir, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Leaf().Subject.CommonName != "n1" || s.Pool() == nil {
		t.Fatalf("loaded %v", s.Leaf().Subject)
	}
	cert, ca := s.Expiries()
	if cert.IsZero() || ca.IsZero() || !cert.Before(ca) {
		t.Fatalf("expiries: certificate %v, CA %v", cert, ca)
	}
	serial := s.Leaf().SerialNumber
	if err := os.WriteFile(filepath.Join(dir, "n1.pem"), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "node certificate") {
		t.Fatalf("a broken file reloaded: %v", err)
	}
	if s.Leaf().SerialNumber.Cmp(serial) != 0 {
		t.Fatal("a failed reload replaced the certificate in use")
	}
	// n2's pair over n1's files: the reload takes it.
	for _, f := range [][2]string{{"n2.pem", "n1.pem"}, {"n2-key.pem", "n1-key.pem"}} {
		b, _ := os.ReadFile(filepath.Join(dir, f[0]))
		os.WriteFile(filepath.Join(dir, f[1]), b, 0o600)
	}
	if err := s.Reload(); err != nil || s.Leaf().Subject.CommonName != "n2" {
		t.Fatalf("reload of a good pair: %v, in use %v", err, s.Leaf().Subject)
	}
}

func TestLoad_RefusesWhatCannotWork(t *testing.T) {
	dir := makeDir(t, "n1")
	for _, c := range []struct {
		f    certs.Files
		want string
	}{
		{certs.Files{Cert: filepath.Join(dir, "n1.pem")}, "both the certificate and its key"},
		{certs.Files{Cert: filepath.Join(dir, "n1.pem"), Key: filepath.Join(dir, "ca-key.pem")}, "private key does not match"},
		{certs.Files{CA: filepath.Join(dir, "n1-key.pem")}, "no PEM certificate"},
		{certs.Files{CA: filepath.Join(dir, "missing.pem")}, "no such file"},
	} {
		if _, err := certs.Load("node", c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: want %q, got %v", c.f, c.want, err)
		}
	}
}

// TestConfigs_NewHandshakesUseTheReloadedCertificate: a server and a
// client built once from stores present and check what the stores hold
// at each handshake.
func TestConfigs_NewHandshakesUseTheReloadedCertificate(t *testing.T) {
	dir := makeDir(t, "n1", "n2")
	srv, err := certs.Load("node", files(dir, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := certs.Load("node", files(dir, "n2"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv.ServerConfig(srv, tls.RequireAndVerifyClientCert, []string{"p/1"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	served := func() string {
		cfg := cli.ClientConfig(cli, "p/1", "127.0.0.1", nil)
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := served()
	if before != srv.Leaf().SerialNumber.String() {
		t.Fatal("the server presented another certificate than its store's")
	}
	if err := pki.Main([]string{"node", "-ca", dir, "-id", "n1", "-host", "127.0.0.1", "-out", filepath.Join(dir, "next")}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	os.Rename(filepath.Join(dir, "next", "n1.pem"), filepath.Join(dir, "n1.pem"))
	os.Rename(filepath.Join(dir, "next", "n1-key.pem"), filepath.Join(dir, "n1-key.pem"))
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if after := served(); after == before || after != srv.Leaf().SerialNumber.String() {
		t.Fatalf("after the reload the server presents %s (was %s)", after, before)
	}
	// The wrong name: the client checks the SANs against the dialed host.
	cfg := cli.ClientConfig(cli, "p/1", "10.9.9.9", nil)
	if c, err := tls.Dial("tcp", ln.Addr().String(), cfg); err == nil {
		c.Close()
		t.Fatal("a certificate for 127.0.0.1 passed for 10.9.9.9")
	}
	if certs.ServerName(net.JoinHostPort("10.0.0.1", "7000")) != "10.0.0.1" {
		t.Fatal("ServerName")
	}
}
