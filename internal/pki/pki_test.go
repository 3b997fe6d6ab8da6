package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// run is stockd cert with args.
func run(t *testing.T, args ...string) error {
	t.Helper()
	var out, errs bytes.Buffer
	return Main(args, &out, &errs)
}

// makeCluster writes a CA and node certificates for ids into dir.
func makeCluster(t *testing.T, dir string, ids ...string) {
	t.Helper()
	if err := run(t, "ca", "-out", dir); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := run(t, "node", "-ca", dir, "-id", id, "-host", "127.0.0.1,"+id+".shop.internal", "-out", dir); err != nil {
			t.Fatal(err)
		}
	}
}

func pool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("no certificate in %s", caFile)
	}
	return p
}

func pair(t *testing.T, dir, base string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, base+".pem"), filepath.Join(dir, base+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// handshake runs a mutual TLS handshake over a pipe: a server with
// serverCert trusting serverCA for clients, a client with clientCert
// trusting clientCA for the server at serverName. It returns the client
// CN the server saw, and each side's error.
func handshake(serverCert, clientCert tls.Certificate, serverCA, clientCA *x509.CertPool, serverName string) (string, error, error) {
	a, b := net.Pipe()
	srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: serverCA, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
	cli := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: clientCA, ServerName: serverName, MinVersion: tls.VersionTLS13})
	srv.SetDeadline(time.Now().Add(5 * time.Second))
	cli.SetDeadline(time.Now().Add(5 * time.Second))
	done := make(chan error, 1)
	go func() {
		err := cli.Handshake()
		if err != nil {
			b.Close()
		}
		done <- err
	}()
	serr := srv.Handshake()
	if serr != nil {
		a.Close()
	}
	cerr := <-done
	cn := ""
	if serr == nil {
		if peers := srv.ConnectionState().PeerCertificates; len(peers) > 0 {
			cn = peers[0].Subject.CommonName
		}
	}
	a.Close()
	b.Close()
	return cn, serr, cerr
}

// TestCert_NodesAuthenticateEachOtherAndNameTheirNode: two node
// certificates of one CA complete a mutual handshake both ways, over an IP
// SAN and a DNS SAN, and the server reads its peer's node id from the CN.
func TestCert_NodesAuthenticateEachOtherAndNameTheirNode(t *testing.T) {
	dir := t.TempDir()
	makeCluster(t, dir, "n1", "n2")
	ca := pool(t, filepath.Join(dir, CAFile))
	n1, n2 := pair(t, dir, "n1"), pair(t, dir, "n2")
	for _, name := range []string{"127.0.0.1", "n1.shop.internal"} {
		cn, serr, cerr := handshake(n1, n2, ca, ca, name)
		if serr != nil || cerr != nil || cn != "n2" {
			t.Fatalf("n2 dialing n1 at %s: server %v, client %v, peer %q", name, serr, cerr, cn)
		}
	}
	if cn, serr, cerr := handshake(n2, n1, ca, ca, "n2.shop.internal"); serr != nil || cerr != nil || cn != "n1" {
		t.Fatalf("n1 dialing n2: %v %v %q", serr, cerr, cn)
	}
	// n1's certificate does not name n2's address.
	if _, _, cerr := handshake(n1, n2, ca, ca, "n2.shop.internal"); cerr == nil {
		t.Fatal("a client accepted n1's certificate for n2's name")
	}
	leaf, err := x509.ParseCertificate(n1.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "n1" || len(leaf.IPAddresses) != 1 || len(leaf.DNSNames) != 1 || leaf.NotAfter.Before(time.Now().Add(800*24*time.Hour)) {
		t.Fatalf("n1's certificate: CN %q, IPs %v, DNS %v, until %s", leaf.Subject.CommonName, leaf.IPAddresses, leaf.DNSNames, leaf.NotAfter)
	}
}

// TestCert_AnotherCAsCertificateIsRefused: a node certificate made by a
// second CA fails the handshake with a node of the first, either way.
func TestCert_AnotherCAsCertificateIsRefused(t *testing.T) {
	ours, theirs := t.TempDir(), t.TempDir()
	makeCluster(t, ours, "n1")
	makeCluster(t, theirs, "n2")
	ca := pool(t, filepath.Join(ours, CAFile))
	if _, serr, _ := handshake(pair(t, ours, "n1"), pair(t, theirs, "n2"), ca, ca, "127.0.0.1"); serr == nil {
		t.Fatal("n1 accepted a client certificate of another CA")
	}
	if _, _, cerr := handshake(pair(t, theirs, "n2"), pair(t, ours, "n1"), ca, ca, "127.0.0.1"); cerr == nil {
		t.Fatal("a client accepted a server certificate of another CA")
	}
}

func TestCert_ClientCertificateServesClientsOnly(t *testing.T) {
	dir := t.TempDir()
	makeCluster(t, dir, "n1")
	if err := run(t, "client", "-ca", dir, "-name", "orders-svc", "-out", dir); err != nil {
		t.Fatal(err)
	}
	ca := pool(t, filepath.Join(dir, CAFile))
	svc := pair(t, dir, "orders-svc")
	if cn, serr, cerr := handshake(pair(t, dir, "n1"), svc, ca, ca, "127.0.0.1"); serr != nil || cerr != nil || cn != "orders-svc" {
		t.Fatalf("orders-svc calling n1: %v %v %q", serr, cerr, cn)
	}
	if _, _, cerr := handshake(svc, pair(t, dir, "n1"), ca, ca, "127.0.0.1"); cerr == nil {
		t.Fatal("a client certificate served TLS")
	}
}

// TestCert_NeverOverwritesAndKeepsKeysPrivate: a second run refuses to
// replace a file; keys are readable by their owner only.
func TestCert_NeverOverwritesAndKeepsKeysPrivate(t *testing.T) {
	dir := t.TempDir()
	makeCluster(t, dir, "n1")
	before, _ := os.ReadFile(filepath.Join(dir, "n1-key.pem"))
	for _, args := range [][]string{{"ca", "-out", dir}, {"node", "-ca", dir, "-id", "n1", "-host", "127.0.0.1", "-out", dir}} {
		if err := run(t, args...); !errors.Is(err, ErrExists) {
			t.Fatalf("%v over existing files: %v", args, err)
		}
	}
	after, _ := os.ReadFile(filepath.Join(dir, "n1-key.pem"))
	if !bytes.Equal(before, after) {
		t.Fatal("a key was overwritten")
	}
	for _, f := range []string{CAKeyFile, "n1-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, st.Mode(), err)
		}
	}
}

func TestCert_RefusesWhatCannotMakeACertificate(t *testing.T) {
	dir := t.TempDir()
	makeCluster(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "-id", "n1", "-host", "127.0.0.1", "-out", dir}, "needs -ca"},
		{[]string{"node", "-ca", dir, "-host", "127.0.0.1", "-out", dir}, "node's id"},
		{[]string{"node", "-ca", dir, "-id", "n1", "-out", dir}, "addresses"},
		{[]string{"client", "-ca", dir, "-out", dir}, "client's name"},
		{[]string{"node", "-ca", t.TempDir(), "-id", "n1", "-host", "h", "-out", dir}, "stockd cert ca"},
		{[]string{"ca", "-out", t.TempDir(), "-days", "5000"}, "validity"},
		{[]string{"node", "-ca", dir, "-id", "../n1", "-host", "h", "-out", dir}, "file name"},
		{[]string{"server"}, "unknown certificate kind"},
	} {
		if err := run(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestCert_OpenSSLAgrees: openssl verifies what stockd cert makes for the
// purposes a node uses them for.
func TestCert_OpenSSLAgrees(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed")
	}
	dir := t.TempDir()
	makeCluster(t, dir, "n1")
	for _, purpose := range []string{"sslserver", "sslclient"} {
		out, err := exec.Command("openssl", "verify", "-purpose", purpose, "-CAfile", filepath.Join(dir, CAFile), filepath.Join(dir, "n1.pem")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ": OK") {
			t.Fatalf("openssl verify -purpose %s: %v\n%s", purpose, err, out)
		}
	}
}
