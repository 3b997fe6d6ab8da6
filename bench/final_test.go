package bench

import (
	"context"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// A stockd row's count without the audit (-no-final-audit) comes from
// the SKU rows: sold and held units are sold, available and leased ones
// left, and no audit is asked for.
func TestFinal_WithoutTheAuditReadsTheRows(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	audits := 0
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/v1/skus/a":
			ctx.SetBodyString(`{"sku":"a","total":10,"remaining":4,"available":3,"leased":1,"held":2,"sold":4,"state":"open"}`)
		case "/v1/skus/b":
			ctx.SetBodyString(`{"sku":"b","total":5,"remaining":5,"available":5,"leased":0,"held":0,"sold":0,"state":"open"}`)
		default:
			audits++
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	s := newStockd([]string{"http://" + ln.Addr().String()}, 1, "", "", false, nil)
	s.sc = &Scenario{SKUs: []string{"a", "b"}}
	s.noAudit = true
	f, err := s.Final(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f.Sold != 6 || f.Remaining != 9 || !f.Valid || audits != 0 {
		t.Fatalf("final %+v after %d other calls, want 6 sold (4 + 2 held), 9 left (3 + 1 leased + 5), valid, no audit", f, audits)
	}
}
