package scenario

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/node/nodetest"
)

// serviceMain is a shop's order service as a user writes it from
// docs/client.md: it imports the client alone, creates a sale of 20 units
// on the node it is given and sends 30 buyers at it, then prints what it
// was told.
const serviceMain = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"stockd.dev/stockd/client"
)

func main() {
	c, err := client.New(client.Config{Endpoints: []string{os.Args[1]}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.CreateSale(ctx, "svc-phone", client.SaleConfig{Total: 20}); err != nil {
		fmt.Fprintln(os.Stderr, "create:", err)
		os.Exit(1)
	}
	won, soldOut := 0, 0
	for i := 0; i < 30; i++ {
		o, err := c.Deduct(ctx, client.Deduct{SKU: "svc-phone", User: fmt.Sprintf("buyer-%d", i), RequestID: fmt.Sprintf("svc-%d", i)})
		switch {
		case err == nil && o.State == "sold":
			won++
		case errors.Is(err, client.ErrSoldOut):
			soldOut++
		default:
			fmt.Fprintln(os.Stderr, "deduct:", o, err)
			os.Exit(1)
		}
	}
	sale, err := c.SKU(ctx, "svc-phone")
	if err != nil {
		fmt.Fprintln(os.Stderr, "read:", err)
		os.Exit(1)
	}
	fmt.Printf("won %d sold_out %d remaining %d sold %d\n", won, soldOut, sale.Remaining, sale.Sold)
}
`

// TestClientModule_AServiceGetsTheClientAlone: a service module made in a
// temporary directory, with a replace to this checkout's client as a user
// without network would write it, depends on the client and the standard
// library alone (no raft, bbolt or fasthttp in go list -deps), builds with
// no module proxy, and runs a sale against a test node: 20 wins, 10
// sold_out, the ledger's law kept and no request id sold twice.
func TestClientModule_AServiceGetsTheClientAlone(t *testing.T) {
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := fmt.Sprintf("module example.com/orders\n\ngo 1.22\n\nrequire stockd.dev/stockd/client v0.0.0\n\nreplace stockd.dev/stockd/client => %s\n", filepath.Join(checkout, "client"))
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(serviceMain), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
		}
		return string(out)
	}

	deps := strings.Fields(goCmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "."))
	if strings.Join(deps, " ") != "stockd.dev/stockd/client example.com/orders" {
		t.Fatalf("the service's packages outside the standard library: %v; want the client and itself", deps)
	}
	for _, p := range strings.Fields(goCmd("list", "-deps", ".")) {
		for _, heavy := range []string{"raft", "bbolt", "fasthttp"} {
			if strings.Contains(p, heavy) {
				t.Fatalf("the service depends on %s", p)
			}
		}
	}
	bin := filepath.Join(dir, "orders")
	goCmd("build", "-o", bin, ".")

	n := nodetest.StartNode(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "http://"+n.HTTPAddr()).CombinedOutput()
	if err != nil {
		t.Fatalf("the service: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "won 20 sold_out 10 remaining 0 sold 20" {
		t.Fatalf("the service printed %q", got)
	}
	hc := nodetest.ClientOf(n, 1)
	audit := nodetest.CheckLedger(t, hc, "svc-phone")
	orders := ledgerOrders(t, hc, "svc-phone")
	if len(orders) != 20 || audit["sold"].(float64) != 20 {
		t.Fatalf("%d request ids with orders, audit %v; want 20 sold", len(orders), audit)
	}
	for req, ids := range orders {
		if len(ids) != 1 {
			t.Fatalf("request id %s has orders %v", req, ids)
		}
	}
	t.Logf("service module deps: %v; it printed %q", deps, strings.TrimSpace(string(out)))
}
