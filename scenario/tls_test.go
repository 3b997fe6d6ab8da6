package scenario

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/internal/pki"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm/command"
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
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
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

// opensslNodeCert makes node id's certificate and key in dir with the
// openssl command line, signed by dir's CA: a CN and SANs only (no key
// usages), as an operator's own tooling might.
func opensslNodeCert(t *testing.T, dir, id, sans string) {
	t.Helper()
	opensslCert(t, dir, dir, id, "subjectAltName="+sans+"\n")
}

// opensslCert makes cn's certificate and key in out (out/cn.pem,
// out/cn-key.pem) with the openssl command line, signed by caDir's CA,
// with the extensions ext (an openssl extfile's lines).
func opensslCert(t *testing.T, caDir, out, cn, ext string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed: the test mixes its certificates with stockd cert's")
	}
	extFile := filepath.Join(out, cn+".ext")
	if err := os.WriteFile(extFile, []byte(ext), 0o600); err != nil {
		t.Fatal(err)
	}
	key, csr, cert := filepath.Join(out, cn+"-key.pem"), filepath.Join(out, cn+".csr"), filepath.Join(out, cn+".pem")
	for _, args := range [][]string{
		{"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-subj", "/CN=" + cn, "-out", csr},
		{"x509", "-req", "-in", csr, "-CA", filepath.Join(caDir, "ca.pem"), "-CAkey", filepath.Join(caDir, "ca-key.pem"), "-CAcreateserial", "-days", "30", "-extfile", extFile, "-out", cert},
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

// stockdClientCert makes a client certificate named name with stockd
// cert client's own code, signed by caDir's CA, in a folder of its own.
func stockdClientCert(t *testing.T, caDir, name string) tls.Certificate {
	t.Helper()
	out := t.TempDir()
	if err := pki.Main([]string{"client", "-ca", caDir, "-name", name, "-out", out}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	return loadPair(t, out, name)
}

// opensslClientCert makes a certificate for clients only (clientAuth)
// named name with openssl, signed by caDir's CA.
func opensslClientCert(t *testing.T, caDir, name string) tls.Certificate {
	t.Helper()
	out := t.TempDir()
	opensslCert(t, caDir, out, name, "extendedKeyUsage=clientAuth\nsubjectAltName=IP:127.0.0.1\n")
	return loadPair(t, out, name)
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
		a := nodetest.CheckLedger(t, p.Client(id), sku)
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
	if code, body := nodetest.Call(t, p.Client(leader), "PUT", "/v1/skus/probe", `{"total":100}`); code != 201 {
		t.Fatalf("create probe: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, p, "probe")
	for i, id := range p.ids { // every node sells, n3 on its openssl certificate too
		if code, body := nodetest.Call(t, p.Client(id), "POST", "/v1/skus/probe/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i)); code != 200 {
			t.Fatalf("deduct through %s: %d %v", id, code, body)
		}
		// With HTTPS the event loop, on by default, is off (it speaks
		// plain HTTP): fasthttp serves every request.
		if m := nodetest.GetRaw(t, p.Client(id), "/metrics"); !strings.Contains(m, "\nstockd_http_event_loop_enabled 0\n") {
			t.Errorf("%s serves HTTPS, and its metrics do not say the event loop is off", id)
		}
	}
	// Let idle leases come home, so that the state stays put.
	var before string
	nodetest.WaitFor(t, 20*time.Second, "a settled, agreed ledger", func() bool {
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
		{"a client certificate of the service", loadPair(t, sec.dir, "client"), `the certificate naming \"client\" is not a node certificate`},
		// A client certificate signed by the node CA and named after a
		// member, by stockd cert client and by openssl (clientAuth only):
		// not a node certificate, whatever its name.
		{"stockd cert client named after a member", stockdClientCert(t, sec.dir, other), `the certificate naming \"` + other + `\" is not a node certificate`},
		{"an openssl client-only certificate named after a member", opensslClientCert(t, sec.dir, other), `the certificate naming \"` + other + `\" is not a node certificate`},
	} {
		if code, body := nodetest.CallQuiet(nodePortClient(sec, leaderPort, c.cert), "GET", statusPath, ""); code != 0 {
			t.Errorf("%s: the node port answered %d %v", c.what, code, body)
		}
		waitLogged(t, p, leader, c.reason)
		unchanged(c.what)
	}
	// A member's own certificate gets in; a take it proposes in another
	// member's name is refused before it is applied, whatever it says it is.
	as := nodePortClient(sec, leaderPort, loadPair(t, sec.dir, other))
	if code, _ := nodetest.CallQuiet(as, "GET", statusPath, ""); code != 200 {
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
	if code, body := nodetest.CallQuiet(noCert, "POST", "/v1/skus/probe/deduct", `{"user":"x","request_id":"x"}`); code != 401 || body["error"] != "client_certificate_required" {
		t.Fatalf("a deduct without a client certificate: %d %v", code, body)
	}
	for _, probe := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := nodetest.CallQuiet(noCert, "GET", probe, ""); code != 200 {
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
	if m := nodetest.GetRaw(t, p.Client(leader), "/metrics"); !strings.Contains(m, `stockd_tls_cert_expiry_timestamp_seconds{cert="node"}`) || !strings.Contains(m, `stockd_tls_cert_expiry_timestamp_seconds{cert="http-client-ca"}`) {
		t.Errorf("no certificate expiry metrics:\n%s", m)
	}
	nodetest.CheckLedger(t, p.Client(leader), "probe")
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
	nodetest.WaitFor(t, 10*time.Second, id+"'s log to say "+text, func() bool {
		b, _ := os.ReadFile(p.dataDir[id] + ".log")
		return bytes.Contains(b, []byte(text))
	})
}

// servedSerial is the serial of the certificate a TLS server at addr
// presents to a new handshake (the node port wants a member's
// certificate: as is one).
func servedSerial(t *testing.T, sec *procSecurity, addr, proto string, as tls.Certificate) string {
	t.Helper()
	cfg := sec.clientTLS(addr)
	if proto != "" {
		cfg.NextProtos = []string{proto}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &as, nil }
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("handshake with %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// fileSerial is the serial of the PEM certificate in file.
func fileSerial(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// TestMultiProcess_TLSRotationUnderLoad: buyers keep buying over HTTPS
// (their connections redialled every few hundred milliseconds) while
// each node in turn gets a new certificate and key written over its
// files and a SIGHUP. A broken file first: the node keeps the certificate
// in use and logs why. Then new handshakes, on the HTTPS port and on the
// node port, present the new certificate, and not one deduct failed.
func TestMultiProcess_TLSRotationUnderLoad(t *testing.T) {
	needMultiProc(t)
	p, sec, bin := secureCluster(t, nil)
	follower := "n1"
	if p.Leader() == follower {
		follower = "n2"
	}
	// Created through a follower: the admin call is relayed to the leader
	// over the node port.
	if code, body := nodetest.Call(t, p.Client(follower), "PUT", "/v1/skus/stream", `{"total":1000000}`); code != 201 {
		t.Fatalf("create sale through follower %s: %d %v", follower, code, body)
	}
	nodetest.WaitSaleEverywhere(t, p, "stream")
	var failed, won atomic.Int64
	var mu sync.Mutex
	acked := map[string]bool{}
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			id := p.ids[w%len(p.ids)]
			c := sec.client(p.httpAddr[id])
			c.MaxConnDuration = 300 * time.Millisecond // new handshakes throughout
			deadline := time.Now().Add(2 * time.Minute)
			for i := 0; time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				code, out := nodetest.CallQuiet(c, "POST", "/v1/skus/stream/deduct", fmt.Sprintf(`{"user":"w%d-%d","request_id":"r%d-%d"}`, w, i, w, i))
				mu.Lock()
				if code == 200 {
					won.Add(1)
					acked[out["order_id"].(string)] = true
				} else {
					failed.Add(1)
					failures = append(failures, fmt.Sprintf("%s: %d %v", id, code, out))
				}
				mu.Unlock()
			}
		}(w)
	}
	member := loadPair(t, sec.dir, "n1")
	for _, id := range p.ids {
		at := won.Load()
		nodetest.WaitFor(t, 20*time.Second, "sales before rotating "+id, func() bool { return won.Load() >= at+100 })
		cert, key := filepath.Join(sec.dir, id+".pem"), filepath.Join(sec.dir, id+"-key.pem")
		old := fileSerial(t, cert)
		// A broken certificate file: the node keeps the one in use.
		good, err := os.ReadFile(cert)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p.signal(id, syscall.SIGHUP)
		waitLogged(t, p, id, "certificate reload failed; the one in use stays")
		if got := servedSerial(t, sec, p.httpAddr[id], "", member); got != old {
			t.Fatalf("%s serves certificate %s after a broken reload, want the old %s", id, got, old)
		}
		os.WriteFile(cert, good, 0o644)
		// The new pair, made beside and renamed over the old files.
		next := filepath.Join(t.TempDir(), "next")
		if out, err := exec.Command(bin, "cert", "node", "-ca", sec.dir, "-id", id, "-host", "127.0.0.1,localhost", "-out", next).CombinedOutput(); err != nil {
			t.Fatalf("stockd cert node: %v\n%s", err, out)
		}
		for _, f := range [][2]string{{id + "-key.pem", key}, {id + ".pem", cert}} {
			if err := os.Rename(filepath.Join(next, f[0]), f[1]); err != nil {
				t.Fatal(err)
			}
		}
		want := fileSerial(t, cert)
		p.signal(id, syscall.SIGHUP)
		nodetest.WaitFor(t, 10*time.Second, id+" presenting its new certificate", func() bool {
			return servedSerial(t, sec, p.httpAddr[id], "", member) == want && servedSerial(t, sec, p.raftAddr[id], protoPeerHTTP, member) == want
		})
		if id == "n1" {
			member = loadPair(t, sec.dir, "n1") // the old n1 key is gone from disk, not from the cluster's trust
		}
	}
	at := won.Load()
	nodetest.WaitFor(t, 20*time.Second, "sales after the last rotation", func() bool { return won.Load() >= at+100 })
	close(stop)
	wg.Wait()
	t.Logf("%d deducts won during the rotation of three nodes' certificates, %d failed", won.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d deducts failed during rotation, first: %v", failed.Load(), failures[:min(5, len(failures))])
	}
	checkClusterLedgers(t, p, "stream", acked)
}

// TestMultiProcess_TLSThreeHosts: three nodes on three hosts of their own
// (network namespaces on a bridge, each with its own address), on node
// certificates that name those addresses. First, on one host: a node
// without certificates refuses to start; with -insecure-plaintext-cluster
// it starts and warns. Then a sale over HTTPS; mid-sale one host is cut
// off the network and brought back: nothing is lost or oversold, and the
// node that was away catches up to the same ledger.
func TestMultiProcess_TLSThreeHosts(t *testing.T) {
	needMultiProc(t)
	net := newHostNet(t, "n1", "n2", "n3")
	p, _, _ := secureCluster(t, func(t *testing.T, bin string, sec *procSecurity) {
		sec.hosts, sec.netns = net.addrs, net.ns
		plaintextOnAHost(t, bin, net)
	})
	const units, buyers = 2000, 4000
	if code := adminCall(t, p.Client(p.Leader()), "PUT", "/v1/skus/tv", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d", code)
	}
	nodetest.WaitSaleEverywhere(t, p, "tv")
	var acked atomic.Int64
	first := buyWave(p, "tv", 0, 500, 16, &acked)
	waveDone := make(chan map[int]buyerResult, 1)
	go func() { waveDone <- buyWave(p, "tv", 500, buyers, 16, &acked) }()
	away := "n3"
	if p.Leader() == away {
		away = "n2"
	}
	at, cutAt := acked.Load(), time.Now()
	net.cut(away)
	nodetest.WaitFor(t, 60*time.Second, "sales go on without "+away, func() bool { return acked.Load() >= at+100 })
	net.heal(away)
	t.Logf("%s was off the network %s, from acknowledgement %d to %d", away, time.Since(cutAt).Round(time.Millisecond), at, acked.Load())
	second := <-waveDone
	for b, r := range second {
		first[b] = r
	}
	nodetest.WaitReady(t, p)
	rest := sellOut(t, p, "tv", units, buyers)
	all := ackedOrders(t, first, rest)
	if len(all) > units {
		t.Fatalf("oversold: %d orders acknowledged for %d units", len(all), units)
	}
	a := checkClusterLedgers(t, p, "tv", all) // the node that was away included
	if a["sold"].(float64)+a["held"].(float64) != units {
		t.Fatalf("after sell-out: %v", a)
	}
}

// plaintextOnAHost: on n1's host, a node with a raft address other hosts
// reach refuses to start without node certificates, and starts (warning)
// with -insecure-plaintext-cluster.
func plaintextOnAHost(t *testing.T, bin string, net *hostNet) {
	t.Helper()
	addr := net.addrs["n1"]
	args := []string{"netns", "exec", net.ns["n1"], bin, "-id", "solo", "-raft", addr + ":7100", "-http", addr + ":8100",
		"-data", filepath.Join(t.TempDir(), "solo"), "-insecure-no-admin-token"}
	out, err := exec.Command("ip", args...).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "needs node certificates") {
		t.Fatalf("without certificates on %s: want exit 1 naming the certificates, got %v:\n%s", addr, err, out)
	}
	log := filepath.Join(t.TempDir(), "solo.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("ip", append(args, "-insecure-plaintext-cluster")...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	nodetest.WaitFor(t, 10*time.Second, "the plaintext node's warning", func() bool {
		b, _ := os.ReadFile(log)
		return bytes.Contains(b, []byte("node-to-node traffic is plain TCP")) && bytes.Contains(b, []byte("stockd serving"))
	})
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the plaintext node did not stop cleanly: %v", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the plaintext node did not stop on SIGTERM")
	}
}
