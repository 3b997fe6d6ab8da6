package httpapi

import (
	"encoding/json"
	"testing"

	"stockd.dev/stockd/engine"
)

// The deduct body decoder meets every client on the hot path: whatever
// the bytes, it answers with JSON and a 2xx/4xx, never a panic (500), and
// the engine sees only a deduct within the contract's bounds.
func FuzzDeductBody(f *testing.F) {
	for _, seed := range []string{
		`{"user":"u","qty":1,"request_id":"r"}`, `{"user":"u"}`, `{"user":"","qty":0}`,
		`{"user":"u","qty":1001}`, `{"user":"u","qty":1.5}`, `{"user":1}`, `[]`, `null`, ``, `{"user":"u","qty":-1}`,
		`{"user":"\u00e9\u0000","request_id":"` + string(make([]byte, 200)) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, fe := newTestServer(t, "")
		fe.status = engine.StatusOK
		ctx := newCtx("POST", "/v1/skus/a/deduct", string(body), loopback)
		s.handle(ctx)
		code := ctx.Response.StatusCode()
		if code >= 500 || !json.Valid(ctx.Response.Body()) {
			t.Fatalf("body %q: %d %s", body, code, ctx.Response.Body())
		}
		if code == 200 {
			r := fe.lastReq
			if len(r.User) == 0 || len(r.User) > maxIDBytes || r.Qty < 1 || r.Qty > engine.MaxQtyPerDeduct || len(r.RequestID) > maxIDBytes {
				t.Fatalf("body %q reached the engine as %+v", body, r)
			}
		}
	})
}

// The admin body decoder is strict: a sale config it accepts has sane
// terms, and anything else is a clear 400, never a 500.
func FuzzAdminSaleBody(f *testing.F) {
	for _, seed := range []string{
		`{"total":5}`, `{"total":5,"per_user":1,"hold_ttl":"90s","start_at":"2026-11-30T12:00:00Z"}`,
		`{"total":-1}`, `{"total":5,"typo":1}`, `{"total":5}{"total":6}`, `{"hold_ttl":"forever","total":1}`, `{}`, `x`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, _ := newTestServer(t, "")
		ctx := newCtx("PUT", "/v1/skus/a", string(body), loopback)
		s.handle(ctx)
		code := ctx.Response.StatusCode()
		if (code != 200 && code != 201 && code != 400 && code != 409) || !json.Valid(ctx.Response.Body()) {
			t.Fatalf("body %q: %d %s", body, code, ctx.Response.Body())
		}
	})
}
