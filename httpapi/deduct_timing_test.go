package httpapi

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkHandler compares the deduct handler (parse, validate, call the
// engine, answer) with a handler that only writes a fixed body, without
// the network, so the handler's own cost is visible.
func BenchmarkHandler(b *testing.B) {
	body := []byte(`{"error":"sold_out","detail":"no units left"}` + "\n")
	noop := func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(409)
		ctx.SetContentType(contentTypeJSON)
		ctx.SetBody(body)
	}
	run := func(b *testing.B, h fasthttp.RequestHandler) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := newCtx("POST", "/v1/skus/a/deduct", `{"user":"u123","qty":1,"request_id":"req-123"}`, loopback)
			for pb.Next() {
				ctx.Response.Reset()
				h(ctx)
			}
		})
	}
	b.Run("noop", func(b *testing.B) { run(b, noop) })
	b.Run("deduct-sold-out", func(b *testing.B) {
		s, _ := newTestServer(b, "")
		run(b, s.handle)
	})
}
