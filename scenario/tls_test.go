package scenario

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd/internal/testnode"
	"stockd/raftfsm/command"
)

// The node port's protocol names (what nodeport's ALPN offers).
const protoPeerHTTP = "stockd-peer-http/1"

func needMultiProc(t *testing.T) {
	t.Helper()
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run three stockd processes")
	}
}

// TestMultiProcess_TLSLeaderKilledMidSale: three processes on node
// certificates made by `stockd cert`, buyers over HTTPS re-sending their
// request ids to any node until answered, the leader killed with SIGKILL
// mid-sale and restarted: nothing oversold or lost, the law holds.
func TestMultiProcess_TLSLeaderKilledMidSale(t *testing.T) {
	needMultiProc(t)
	p, _, _ := secureCluster(t, nil)
	leaderKilledMidSale(t, p)
}

// TestNonLoopbackRaftNeedsCertificates: a node whose raft address other
// machines reach (0.0.0.0 counts) refuses to start without node
// certificates, alone as well, and says how to make them.
func TestNonLoopbackRaftNeedsCertificates(t *testing.T) {
	dir := t.TempDir()
	bin := buildStockd(t, dir)
	out, err := exec.Command(bin, "-raft", "0.0.0.0:0", "-http", "127.0.0.1:0", "-data", filepath.Join(dir, "data")).CombinedOutput()
	var exit *exec.ExitError
	if !errorsAs(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("want exit status 1, got %v:\n%s", err, out)
	}
	for _, want := range []string{"-raft 0.0.0.0:0 is reachable from other machines", "stockd cert ca -out certs", "-insecure-plaintext-cluster"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Error("the refused node created its data dir")
	}
}

func errorsAs(err error, exit **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*exit = e
	return ok
}

// opensslNodeCert makes node id's certificate and key in dir with the
// openssl command line, signed by dir's CA: a CN and SANs only (no key
// usages), as an operator's own tooling might.
func opensslNodeCert(t *testing.T, dir, id, sans string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed: the test mixes its certificates with stockd cert's")
	}
	ext := filepath.Join(dir, id+".ext")
	if err := os.WriteFile(ext, []byte("subjectAltName="+sans+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key, csr, cert := filepath.Join(dir, id+"-key.pem"), filepath.Join(dir, id+".csr"), filepath.Join(dir, id+".pem")
	for _, args := range [][]string{
		{"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-subj", "/CN=" + id, "-out", csr},
		{"x509", "-req", "-in", csr, "-CA", filepath.Join(dir, "ca.pem"), "-CAkey", filepath.Join(dir, "ca-key.pem"), "-CAcreateserial", "-days", "30", "-extfile", ext, "-out", cert},
	} {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// signed makes a certificate for cn signed by dir's CA (or a fresh
// self-made CA when foreign), valid from notBefore to notAfter.
func signed(t *testing.T, dir, cn string, notBefore, notAfter time.Time, foreign bool) tls.Certificate {
	t.Helper()
	var caCert *x509.Certificate
	var caKey any
	if foreign {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "another CA"}, NotBefore: notBefore, NotAfter: notAfter.Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		caCert, _ = x509.ParseCertificate(der)
		caKey = k
	} else {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		caCert, _ = x509.ParseCertificate(pair.Certificate[0])
		caKey = pair.PrivateKey
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}

// loadPair reads dir/<name>.pem and its key.
func loadPair(t *testing.T, dir, name string) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// nodePortClient calls a node port's HTTP as the holder of cert would.
func nodePortClient(sec *procSecurity, addr string, cert tls.Certificate) *fasthttp.HostClient {
	cfg := sec.clientTLS(addr)
	cfg.NextProtos = []string{protoPeerHTTP}
	// Present cert whatever CAs the server asks for (Go's client would
	// otherwise send none that another CA signed).
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return &fasthttp.HostClient{Addr: addr, ReadTimeout: 5 * time.Second, MaxIdemponentCallAttempts: 1,
		Dial: func(a string) (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", a, cfg)
		}}
}

// saleState is what a refusal must leave unchanged: the sale's row and
// its orders, on every node.
func saleState(t *testing.T, p *procCluster, sku string) string {
	t.Helper()
	var states []string
	for _, id := range p.ids {
		a := testnode.CheckLedger(t, p.Client(id), sku)
		states = append(states, fmt.Sprint(a["total"], a["available"], a["held"], a["sold"], a["orders"], a["leased"]))
	}
	for _, s := range states[1:] {
		if s != states[0] {
			return strings.Join(states, " | ")
		}
	}
	return states[0]
}

// TestMultiProcess_TLSRefusals: on a cluster of node certificates (n3's
// made with openssl, CN and SANs only, beside stockd cert's) with client
// certificates required, each way in that is not a member's is refused,
// logged with its reason, and leaves the ledger as it was.
func TestMultiProcess_TLSRefusals(t *testing.T) {
	needMultiProc(t)
	p, sec, _ := secureCluster(t, func(t *testing.T, bin string, sec *procSecurity) {
		makeCerts(t, bin, sec.dir, []string{"n1", "n2"}, nil)
		opensslNodeCert(t, sec.dir, "n3", "IP:127.0.0.1,DNS:localhost")
		sec.clientCA = true
	})
	leader := p.Leader()
	if code, body := testnode.Call(t, p.Client(leader), "PUT", "/v1/skus/probe", `{"total":100}`); code != 201 {
		t.Fatalf("create probe: %d %v", code, body)
	}
	testnode.WaitSaleEverywhere(t, p, "probe")
	for i, id := range p.ids { // every node sells, n3 on its openssl certificate too
		if code, body := testnode.Call(t, p.Client(id), "POST", "/v1/skus/probe/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i)); code != 200 {
			t.Fatalf("deduct through %s: %d %v", id, code, body)
		}
	}
	// Let idle leases come home, so that the state stays put.
	var before string
	testnode.WaitFor(t, 20*time.Second, "a settled, agreed ledger", func() bool {
		s := saleState(t, p, "probe")
		settled := s == before && !strings.Contains(s, "|")
		before = s
		return settled
	})
	unchanged := func(what string) {
		t.Helper()
		if after := saleState(t, p, "probe"); after != before {
			t.Fatalf("%s changed the ledger: %s, then %s", what, before, after)
		}
	}
	var other, victim string // two nodes other than the leader
	for _, id := range p.ids {
		if id != leader {
			if other == "" {
				other = id
			} else {
				victim = id
			}
		}
	}
	leaderPort := p.raftAddr[leader]
	now := time.Now()
	statusPath := "/internal/v1/status"
	for _, c := range []struct {
		what   string
		cert   tls.Certificate
		reason string
	}{
		{"a node certificate from another CA", signed(t, sec.dir, other, now.Add(-time.Hour), now.Add(time.Hour), true), "unknown authority"},
		{"an expired node certificate", signed(t, sec.dir, other, now.Add(-48*time.Hour), now.Add(-24*time.Hour), false), "expired"},
		{"a certificate naming a node that is not a member", signed(t, sec.dir, "n9", now.Add(-time.Hour), now.Add(time.Hour), false), `node \"n9\" is not a member`},
		{"a client certificate of the service (not a member)", loadPair(t, sec.dir, "client"), `node \"client\" is not a member`},
	} {
		if code, body := testnode.CallQuiet(nodePortClient(sec, leaderPort, c.cert), "GET", statusPath, ""); code != 0 {
			t.Errorf("%s: the node port answered %d %v", c.what, code, body)
		}
		waitLogged(t, p, leader, c.reason)
		unchanged(c.what)
	}
	// A member's own certificate gets in; a take it proposes in another
	// member's name is refused before it is applied, whatever it says it is.
	as := nodePortClient(sec, leaderPort, loadPair(t, sec.dir, other))
	if code, _ := testnode.CallQuiet(as, "GET", statusPath, ""); code != 200 {
		t.Fatalf("%s's own certificate: the node port answered %d", other, code)
	}
	take := command.EncodeCommand(nil, time.Now().UnixNano(), &command.Take{Node: victim,
		Entries: []command.TakeEntry{{SKU: "probe", Qty: 1, User: "mallory", RequestID: "stolen", OrderID: victim + "-stolen-1"}}})
	for _, named := range []string{"", victim} {
		headers := map[string]string{}
		if named != "" {
			headers["X-Stockd-Node"] = named
		}
		code, answer := postCommand(t, as, leaderPort, take, headers)
		if code != 403 {
			t.Fatalf("%s proposing a take in %s's name (saying it is %q): %d %s", other, victim, named, code, answer)
		}
		unchanged("a take in another node's name")
	}
	waitLogged(t, p, leader, "refused a forwarded command")
	waitLogged(t, p, leader, "refused a node-to-node call in another node's name")
	// Clients: without a certificate the routes refuse, the probes answer.
	bare := sec.clientTLS(p.httpAddr[leader])
	bare.Certificates = nil
	noCert := &fasthttp.HostClient{Addr: p.httpAddr[leader], IsTLS: true, TLSConfig: bare}
	if code, body := testnode.CallQuiet(noCert, "POST", "/v1/skus/probe/deduct", `{"user":"x","request_id":"x"}`); code != 401 || body["error"] != "client_certificate_required" {
		t.Fatalf("a deduct without a client certificate: %d %v", code, body)
	}
	for _, probe := range []string{"/healthz", "/readyz", "/metrics"} {
		if code := rawStatus(noCert, probe); code != 200 {
			t.Errorf("%s without a client certificate: %d", probe, code)
		}
	}
	unchanged("a deduct without a client certificate")
	// Plain HTTP to the HTTPS port, plain TCP to the node port: nothing
	// that reads as an answer.
	for _, addr := range []string{p.httpAddr[leader], leaderPort} {
		if got := plainExchange(t, addr, "POST /v1/skus/probe/deduct HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\n\r\n{\"user\":\"y\",\"request_id\":\"y1\"}\n"); bytes.Contains(got, []byte("HTTP/1.1 2")) || bytes.Contains(got, []byte("order_id")) {
			t.Errorf("plain text to %s got an answer: %q", addr, got)
		}
	}
	waitLogged(t, p, leader, "first record does not look like a TLS handshake")
	unchanged("plain HTTP and plain TCP")
	// The metric: each certificate's expiry.
	if m := testnode.GetRaw(t, p.Client(leader), "/metrics"); !strings.Contains(m, `stockd_tls_cert_expiry_timestamp_seconds{cert="node"}`) || !strings.Contains(m, `stockd_tls_cert_expiry_timestamp_seconds{cert="http-client-ca"}`) {
		t.Errorf("no certificate expiry metrics:\n%s", m)
	}
	testnode.CheckLedger(t, p.Client(leader), "probe")
}

// rawStatus is the status of GET path through c (0 on a transport error).
func rawStatus(c *fasthttp.HostClient, path string) int {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(testnode.URL(c, path))
	if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
		return 0
	}
	return resp.StatusCode()
}

// plainExchange writes msg over plain TCP to addr and returns what came
// back before the peer closed or two seconds passed.
func plainExchange(t *testing.T, addr, msg string) []byte {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(c, msg)
	got, _ := io.ReadAll(c)
	return got
}

// waitLogged waits until node id's log holds text.
func waitLogged(t *testing.T, p *procCluster, id, text string) {
	t.Helper()
	testnode.WaitFor(t, 10*time.Second, id+"'s log to say "+text, func() bool {
		b, _ := os.ReadFile(p.dataDir[id] + ".log")
		return bytes.Contains(b, []byte(text))
	})
}
