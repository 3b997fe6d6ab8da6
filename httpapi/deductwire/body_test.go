package deductwire

import (
	"testing"

	"github.com/valyala/fastjson"
)

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
		u2, r2, q2, bad2 := Fields(v)
		if string(u1) != string(u2) || string(r1) != string(r2) || q1 != q2 || string(bad1) != string(bad2) {
			t.Fatalf("body %q: scan gives %q %q %d %s, the parser %q %q %d %s", body, u1, r1, q1, bad1, u2, r2, q2, bad2)
		}
	})
}
