package deductwire

import (
	"encoding/json"
	"testing"
)

// FuzzReadDeduct_OneMeaning: a body the reader takes means one thing. It
// is JSON, encoding/json reads the same user, request id and qty from it,
// and those values, encoded again, are taken and read back the same.
func FuzzReadDeduct_OneMeaning(f *testing.F) {
	for _, seed := range []string{
		`{"user":"u","qty":1,"request_id":"r"}`, `{"user":"u"}`, `{}`, ` { "qty" : 7 , "user" : "a b" } `,
		`{"user":"","qty":0}`, `{"user":"u","qty":01}`, `{"user":"u","qty":1e2}`, `{"user":"u","qty":-1}`,
		`{"user":"u","user":"v"}`, `{"user":"u","sku":"x"}`, `{"user":"\u0075"}`, `{"user":"u"} x`,
		`{"user":"u","request_id":"a\u0001"}`, `{"user":"u","qty":99999999999999999999}`, `{"user":"u",}`,
		`{"user":"\ud800"}`, `{"user":"\ud83d\ude00"}`, "{\"user\":\"\xff\"}", `{"user":"bob@x.com","x":[1,{"y":null}]}`,
		`{"user":"\ufffd"}`, `{"user":"a\u0000b"}`, `{"us\u0065r":"u"}`, `{"user":"u","request_id":""}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var scratch []byte
		got, bad := readDeduct(body, &scratch, false)
		if bad != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: taken, but it is not JSON", body)
		}
		var std struct {
			User      *string          `json:"user"`
			RequestID *string          `json:"request_id"`
			Qty       *json.RawMessage `json:"qty"`
		}
		if err := json.Unmarshal(body, &std); err != nil || std.User == nil {
			t.Fatalf("body %q: taken as %q, but encoding/json reads %+v (%v)", body, got.user, std, err)
		}
		rid := ""
		if std.RequestID != nil {
			rid = *std.RequestID
		}
		if *std.User != string(got.user) || rid != string(got.requestID) {
			t.Fatalf("body %q: read as user %q request id %q, encoding/json reads %q %q", body, got.user, got.requestID, *std.User, rid)
		}
		again := map[string]any{"user": string(got.user), "qty": got.qty}
		if got.hasRequestID {
			again["request_id"] = string(got.requestID)
		}
		b, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		back, bad := readDeduct(b, &scratch, false)
		if bad != nil || string(back.user) != string(got.user) || string(back.requestID) != string(got.requestID) || back.qty != got.qty {
			t.Fatalf("body %q: read as %+v; encoded again as %s it reads %+v (%s)", body, got, b, back, bad)
		}
	})
}
