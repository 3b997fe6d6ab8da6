package nodeport_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/internal/certs"
	"stockd.dev/stockd/internal/nodeport"
	"stockd.dev/stockd/internal/pki"
)

func store(t *testing.T, dir, id string) *certs.Store {
	t.Helper()
	if err := pki.Main([]string{"node", "-ca", dir, "-id", id, "-host", "127.0.0.1", "-out", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	s, err := certs.Load("node", certs.Files{Cert: filepath.Join(dir, id+".pem"), Key: filepath.Join(dir, id+"-key.pem"), CA: filepath.Join(dir, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func listen(t *testing.T, s *certs.Store, id string, members ...string) *nodeport.Port {
	t.Helper()
	p, err := nodeport.Listen("127.0.0.1:0", "127.0.0.1:0", id, s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p.SetMembers(func(id string) bool {
		for _, m := range members {
			if m == id {
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { p.Close() })
	return p
}

// accept is one connection from l, or a failure after a deadline.
func accept(t *testing.T, l net.Listener) *nodeport.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			got <- c
		}
	}()
	select {
	case c := <-got:
		return c.(*nodeport.Conn)
	case <-time.After(5 * time.Second):
		t.Fatal("no connection arrived")
		return nil
	}
}

// TestPort_RoutesByProtocolAndNamesThePeer: raft and HTTP connections
// from a member reach their own listeners, each naming the member.
func TestPort_RoutesByProtocolAndNamesThePeer(t *testing.T) {
	dir := t.TempDir()
	if err := pki.Main([]string{"ca", "-out", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	a := listen(t, store(t, dir, "n1"), "n1", "n1", "n2")
	b := listen(t, store(t, dir, "n2"), "n2", "n1", "n2")
	raftConn, err := a.RaftLayer().Dial(raft.ServerAddress("127.0.0.1:"+portOf(b)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raftConn.Close()
	if raftConn.(*nodeport.Conn).PeerID() != "n2" {
		t.Fatalf("dialed n2, the certificate says %s", raftConn.(*nodeport.Conn).PeerID())
	}
	go raftConn.Write([]byte("raft"))
	in := accept(t, b.RaftLayer())
	buf := make([]byte, 4)
	if _, err := io.ReadFull(in, buf); err != nil || string(buf) != "raft" || in.PeerID() != "n1" {
		t.Fatalf("raft connection: %q %v from %s", buf, err, in.PeerID())
	}
	httpConn, err := a.Dial(context.Background(), b.Addr().String(), nodeport.ProtoHTTP, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer httpConn.Close()
	go httpConn.Write([]byte("http"))
	in = accept(t, b.HTTPListener())
	if _, err := io.ReadFull(in, buf); err != nil || string(buf) != "http" || in.PeerID() != "n1" {
		t.Fatalf("http connection: %q %v from %s", buf, err, in.PeerID())
	}
	if b.Refused() != 0 {
		t.Fatalf("%d refused", b.Refused())
	}
}

// TestPort_RefusesNonMembersAndPlainTCP: a certificate the CA signed for
// a node that is not a member, another CA's, and plain TCP are refused at
// the handshake, and counted.
func TestPort_RefusesNonMembersAndPlainTCP(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if err := pki.Main([]string{"ca", "-out", d}, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	b := listen(t, store(t, dir, "n2"), "n2", "n1", "n2")
	outsider := listen(t, store(t, dir, "n9"), "n9", "n1", "n2", "n9")
	foreign := listen(t, store(t, other, "n1"), "n1", "n1", "n2")
	for name, p := range map[string]*nodeport.Port{"a non-member": outsider, "another CA's": foreign} {
		c, err := p.Dial(context.Background(), b.Addr().String(), nodeport.ProtoHTTP, time.Second)
		if err == nil {
			// TLS 1.3: the client finishes first; the refusal shows on read.
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if err == nil {
			t.Errorf("%s certificate got in", name)
		}
	}
	raw, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(raw, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(raw)
	raw.Close()
	if len(got) > 0 && got[0] == 'H' {
		t.Fatalf("plain TCP got an HTTP answer: %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Refused() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if b.Refused() != 3 {
		t.Fatalf("refused %d connections, want 3", b.Refused())
	}
}

func portOf(p *nodeport.Port) string {
	_, port, _ := net.SplitHostPort(p.Addr().String())
	return port
}

// TestPort_ACAChangeThroughABundle follows the operations doc's CA
// change on a listening node, reloading its CA file in place: while it
// trusts the old CA only, a certificate of the new one is refused; with
// a bundle of both, both get in; with the new CA alone, the old one's
// certificate is refused and the new one's still gets in.
func TestPort_ACAChangeThroughABundle(t *testing.T) {
	oldCA, newCA, bdir := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{oldCA, newCA} {
		if err := pki.Main([]string{"ca", "-out", d}, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	oldPEM, newPEM := read(filepath.Join(oldCA, "ca.pem")), read(filepath.Join(newCA, "ca.pem"))
	bundle := filepath.Join(bdir, "node-ca.pem")
	setBundle := func(pems ...[]byte) {
		t.Helper()
		if err := os.WriteFile(bundle, bytes.Join(pems, nil), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// n2 listens on its old-CA certificate and reads its CAs from the bundle.
	setBundle(oldPEM)
	if err := pki.Main([]string{"node", "-ca", oldCA, "-id", "n2", "-host", "127.0.0.1", "-out", bdir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	bStore, err := certs.Load("node", certs.Files{Cert: filepath.Join(bdir, "n2.pem"), Key: filepath.Join(bdir, "n2-key.pem"), CA: bundle})
	if err != nil {
		t.Fatal(err)
	}
	b := listen(t, bStore, "n2", "n1", "n2")
	// n1 twice: on the old CA's certificate, and on the new CA's (which
	// trusts both CAs, as every node does during the change).
	withOld := listen(t, store(t, oldCA, "n1"), "n1", "n1", "n2")
	newDir := t.TempDir()
	if err := pki.Main([]string{"node", "-ca", newCA, "-id", "n1", "-host", "127.0.0.1", "-out", newDir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	both := filepath.Join(newDir, "both.pem")
	if err := os.WriteFile(both, append(append([]byte{}, newPEM...), oldPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	newStore, err := certs.Load("node", certs.Files{Cert: filepath.Join(newDir, "n1.pem"), Key: filepath.Join(newDir, "n1-key.pem"), CA: both})
	if err != nil {
		t.Fatal(err)
	}
	withNew := listen(t, newStore, "n1", "n1", "n2")

	// gotIn: n2 takes a connection from p, naming n1.
	gotIn := func(p *nodeport.Port) bool {
		t.Helper()
		c, err := p.Dial(context.Background(), b.Addr().String(), nodeport.ProtoHTTP, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		// TLS 1.3: the client finishes first; a refusal shows on read.
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
		return accept(t, b.HTTPListener()).PeerID() == "n1"
	}
	reload := func(pems ...[]byte) {
		t.Helper()
		setBundle(pems...)
		if err := bStore.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if !gotIn(withOld) {
		t.Fatal("before the change: the old CA's certificate was refused")
	}
	if gotIn(withNew) {
		t.Fatal("before the change: the new CA's certificate got in")
	}
	reload(oldPEM, newPEM)
	if !gotIn(withOld) || !gotIn(withNew) {
		t.Fatal("with both CAs in the bundle: a certificate of one of them was refused")
	}
	reload(newPEM)
	if gotIn(withOld) {
		t.Fatal("with the new CA alone: the old CA's certificate got in")
	}
	if !gotIn(withNew) {
		t.Fatal("with the new CA alone: the new CA's certificate was refused")
	}
}

// TestPort_RefusesAClientCertificateNamedAfterAMember: `stockd cert
// client` signs with the node CA, so a client certificate can carry a
// member's name; it lacks the serverAuth usage a node certificate has,
// and the port refuses it at the handshake, saying why.
func TestPort_RefusesAClientCertificateNamedAfterAMember(t *testing.T) {
	dir := t.TempDir()
	if err := pki.Main([]string{"ca", "-out", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	b, err := nodeport.Listen("127.0.0.1:0", "127.0.0.1:0", "n2", store(t, dir, "n2"), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.SetMembers(func(id string) bool { return id == "n1" || id == "n2" })
	if err := pki.Main([]string{"client", "-ca", dir, "-name", "n1", "-out", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	client, err := certs.Load("node", certs.Files{Cert: filepath.Join(dir, "n1.pem"), Key: filepath.Join(dir, "n1-key.pem"), CA: filepath.Join(dir, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	impostor := listen(t, client, "n1", "n1", "n2")
	c, err := impostor.Dial(context.Background(), b.Addr().String(), nodeport.ProtoHTTP, time.Second)
	if err == nil {
		// TLS 1.3: the client finishes first; the refusal shows on read.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil {
		t.Fatal("a client certificate named n1 got in as node n1")
	}
	// The port counts a refusal, then logs it: wait for both.
	said := func() bool {
		got := logs.String()
		return strings.Contains(got, "not a node certificate") && strings.Contains(got, "serverAuth")
	}
	deadline := time.Now().Add(5 * time.Second)
	for (b.Refused() < 1 || !said()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if b.Refused() != 1 || !said() {
		t.Fatalf("refused %d; the log says %q, want the reason", b.Refused(), logs.String())
	}
}

// syncBuffer is a log sink the port's goroutines write to while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
