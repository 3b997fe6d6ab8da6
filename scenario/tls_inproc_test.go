package scenario

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/client"
	"stockd.dev/stockd/feed"
	"stockd.dev/stockd/internal/pki"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm"
)

// inProcCerts makes, with stockd cert's code, a CA, node certificates
// for ids on loopback and a client certificate "svc" in dir.
func inProcCerts(t *testing.T, dir string, ids ...string) {
	t.Helper()
	steps := [][]string{{"ca", "-out", dir}, {"client", "-ca", dir, "-name", "svc", "-out", dir}}
	for _, id := range ids {
		steps = append(steps, []string{"node", "-ca", dir, "-id", id, "-host", "127.0.0.1,localhost", "-out", dir})
	}
	for _, args := range steps {
		if err := pki.Main(args, io.Discard, io.Discard); err != nil {
			t.Fatalf("stockd cert %s: %v", strings.Join(args, " "), err)
		}
	}
}

// TestClient_OverHTTPSWithClientCertificates: a node on its node
// certificate serving HTTPS that requires client certificates. The Go
// client with the CA and the service's certificate sells; with the CA
// alone it is refused (401, ErrUnauthorized) and nothing changes; the
// feed consumer reads the sale's event over HTTPS.
func TestClient_OverHTTPSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	inProcCerts(t, certs, "n1")
	f := func(name string) string { return filepath.Join(certs, name) }
	cfg := nodetest.NodeConfig(t, "n1", filepath.Join(dir, "n1"), 200*time.Millisecond)
	cfg.ClusterSecret = ""
	cfg.TLS = node.TLSFiles{NodeCert: f("n1.pem"), NodeKey: f("n1-key.pem"), NodeCA: f("ca.pem"),
		HTTPCert: f("n1.pem"), HTTPKey: f("n1-key.pem"), HTTPClientCA: f("ca.pem")}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	endpoint := "https://" + n.HTTPAddr()
	withCert, err := client.TLSFiles(f("ca.pem"), f("svc.pem"), f("svc-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(client.Config{Endpoints: []string{endpoint}, TLS: withCert})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &fasthttp.HostClient{Addr: n.HTTPAddr(), IsTLS: true, TLSConfig: withCert}
	nodetest.WaitFor(t, 10*time.Second, "node ready on its ledger rules", func() bool {
		code, _ := nodetest.CallQuiet(hc, "GET", "/readyz", "")
		return code == 200 && n.Ledger().Rules() == raftfsm.RulesCurrent
	})
	if _, err := cl.CreateSale(ctx, "mug", client.SaleConfig{Total: 3}); err != nil {
		t.Fatal(err)
	}
	o, err := cl.Deduct(ctx, client.Deduct{SKU: "mug", User: "ann", RequestID: "r-1"})
	if err != nil || o.State != "sold" {
		t.Fatalf("a deduct over HTTPS with a client certificate: %+v %v", o, err)
	}
	caOnly, err := client.TLSFiles(f("ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	bare, err := client.New(client.Config{Endpoints: []string{endpoint}, TLS: caOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := bare.Deduct(ctx, client.Deduct{SKU: "mug", User: "bob", RequestID: "r-2"}); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("a deduct without a client certificate: %v", err)
	}
	bareHC := &fasthttp.HostClient{Addr: n.HTTPAddr(), IsTLS: true, TLSConfig: caOnly}
	if code, _ := nodetest.CallQuiet(bareHC, "GET", "/readyz", ""); code != 200 {
		t.Fatalf("/readyz without a client certificate: %d", code)
	}
	var out, logs bytes.Buffer
	err = feed.Main(ctx, []string{"-target", endpoint, "-consumer", "orders", "-from", "0", "-ack=false", "-wait", "0s", "-exit-when-idle",
		"-ca", f("ca.pem"), "-cert", f("svc.pem"), "-key", f("svc-key.pem")}, &out, &logs)
	if err != nil || !strings.Contains(out.String(), o.OrderID) {
		t.Fatalf("the feed over HTTPS: %v\n%s\n%s", err, out.String(), logs.String())
	}
	// The operator's page names the certificate that expires first.
	if code, st := nodetest.CallQuiet(hc, "GET", "/v1/stats", ""); code != 200 || st["tls_nearest_expiry"] == nil ||
		st["tls_nearest_expiry"].(map[string]any)["name"] == "" {
		t.Fatalf("/v1/stats without the nearest expiry: %d %v", code, st["tls_nearest_expiry"])
	}
	a := nodetest.CheckLedger(t, hc, "mug")
	if a["sold"].(float64) != 1 || a["orders"].(float64) != 1 {
		t.Fatalf("one sale, one order: %v", a)
	}
}
