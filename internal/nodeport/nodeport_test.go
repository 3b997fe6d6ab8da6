package nodeport_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"stockd/internal/certs"
	"stockd/internal/nodeport"
	"stockd/internal/pki"
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
