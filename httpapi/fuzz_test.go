package httpapi

import (
	"encoding/json"
	"testing"

	"github.com/valyala/fastjson"

	"stockd/engine"
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

// scanDeduct, the deduct handler's fast path, answers only where the full
// parser agrees: the same user, request id and qty, or the same refusal.
func FuzzScanDeduct_AgreesWithTheParser(f *testing.F) {
	for _, seed := range []string{
		`{"user":"u","qty":1,"request_id":"r"}`, `{"user":"u"}`, `{}`, ` { "qty" : 7 , "user" : "a b" } `,
		`{"user":"","qty":0}`, `{"user":"u","qty":01}`, `{"user":"u","qty":1e2}`, `{"user":"u","qty":-1}`,
		`{"user":"u","user":"v"}`, `{"user":"u","sku":"x"}`, `{"user":"\u0075"}`, `{"user":"u"} x`,
		`{"user":"u","request_id":"a` + "\x01" + `"}`, `{"user":"u","qty":99999999999999999999}`, `{"user":"u",}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fb, ok := scanDeduct(body)
		if !ok {
			return
		}
		u1, r1, q1, bad1 := fb.check()
		var p fastjson.Parser
		v, err := p.ParseBytes(body)
		if err != nil || v.Type() != fastjson.TypeObject {
			t.Fatalf("body %q: scanned as %+v, but the parser refuses it (%v)", body, fb, err)
		}
		u2, r2, q2, bad2 := deductFields(v)
		if string(u1) != string(u2) || string(r1) != string(r2) || q1 != q2 || string(bad1) != string(bad2) {
			t.Fatalf("body %q: scan gives %q %q %d %s, the parser %q %q %d %s", body, u1, r1, q1, bad1, u2, r2, q2, bad2)
		}
	})
}
