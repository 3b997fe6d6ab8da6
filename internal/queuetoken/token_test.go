package queuetoken

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var (
	keyA = Key{ID: 7, Bytes: bytes.Repeat([]byte{0xa5}, KeySize)}
	keyB = Key{ID: 8, Bytes: bytes.Repeat([]byte{0x5a}, KeySize)}
)

const expiry = int64(1_800_000_000_000_000_000)

func signed() (Token, [IDSize]byte) {
	id := TicketID("secret-of-alice")
	return Sign(keyA, "phone", "alice", id, expiry), id
}

// TestToken_RoundTripAndVerify: a signed token reads back from its wire
// form and verifies for its sale and user before its expiry, under the
// current key or as the previous one.
func TestToken_RoundTripAndVerify(t *testing.T) {
	tok, _ := signed()
	s := tok.String()
	if len(s) != WireSize {
		t.Fatalf("wire form is %d characters, want %d", len(s), WireSize)
	}
	back, err := Parse(s)
	if err != nil || back != tok {
		t.Fatalf("Parse(%q) = %+v, %v; want %+v", s, back, err, tok)
	}
	for _, keys := range [][]Key{{keyA}, {keyB, keyA}} {
		if err := back.Verify(keys, "phone", "alice", expiry-1); err != nil {
			t.Fatalf("keys %v: %v", keys, err)
		}
	}
}

// TestToken_Refusals: each way a token can be wrong is refused with its
// own error.
func TestToken_Refusals(t *testing.T) {
	tok, id := signed()
	s := tok.String()
	altered := []byte(s)
	altered[40] ^= 1 // a bit of the ticket id: still base64, not the MAC's
	if altered[40] == s[40] {
		t.Fatal("the byte did not change")
	}
	other := Sign(keyA, "phone", "bob", TicketID("secret-of-bob"), expiry)
	for _, c := range []struct {
		name      string
		token     string
		keys      []Key
		sku, user string
		now       int64
		want      error
	}{
		{"empty", "", []Key{keyA}, "phone", "alice", 0, ErrMalformed},
		{"short", s[1:], []Key{keyA}, "phone", "alice", 0, ErrMalformed},
		{"padded", s[:len(s)-1] + "=", []Key{keyA}, "phone", "alice", 0, ErrMalformed},
		{"standard alphabet", "+" + s[1:], []Key{keyA}, "phone", "alice", 0, ErrMalformed},
		{"last character's spare bits set", s[:len(s)-1] + spareBitsSet(s[len(s)-1]), []Key{keyA}, "phone", "alice", 0, ErrMalformed},
		{"altered by a byte", string(altered), []Key{keyA}, "phone", "alice", 0, ErrForged},
		{"another user's", s, []Key{keyA}, "phone", "bob", 0, ErrForged},
		{"another SKU's", s, []Key{keyA}, "tv", "alice", 0, ErrForged},
		{"bob's token for alice", other.String(), []Key{keyA}, "phone", "alice", 0, ErrForged},
		{"expired", s, []Key{keyA}, "phone", "alice", expiry, ErrExpired},
		{"key rotated out", s, []Key{keyB, {ID: 9, Bytes: keyB.Bytes}}, "phone", "alice", 0, ErrUnknownKey},
		{"forged with another key", Sign(Key{ID: 7, Bytes: keyB.Bytes}, "phone", "alice", id, expiry).String(), []Key{keyA}, "phone", "alice", 0, ErrForged},
	} {
		tok, err := Parse(c.token)
		if err == nil {
			err = tok.Verify(c.keys, c.sku, c.user, c.now)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// spareBitsSet is c, the last character of a wire form, with a bit set
// that carries no data: a second spelling the strict reading refuses.
func spareBitsSet(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return string(alphabet[i|1])
}

// FuzzParse: Parse never panics, and what it accepts has one spelling:
// the token written back is the input.
func FuzzParse(f *testing.F) {
	tok, _ := signed()
	f.Add(tok.String())
	f.Add("")
	f.Add(strings.Repeat("A", WireSize))
	f.Add(strings.Repeat("_", WireSize))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q): %v is not ErrMalformed", s, err)
			}
			return
		}
		if back := tok.String(); back != s {
			t.Fatalf("Parse(%q) writes back as %q", s, back)
		}
		if err := tok.Verify([]Key{keyA}, "phone", "alice", 1); err == nil && s != signedString() {
			t.Fatalf("a fuzzed token %q verified", s)
		}
	})
}

func signedString() string {
	tok, _ := signed()
	return tok.String()
}

// BenchmarkToken_ParseAndVerify is the deduct's whole check of a token:
// its wire form read, its MAC recomputed, its expiry compared.
func BenchmarkToken_ParseAndVerify(b *testing.B) {
	s := signedString()
	keys := []Key{keyB, keyA}
	b.ReportAllocs()
	for b.Loop() {
		tok, err := Parse(s)
		if err == nil {
			err = tok.Verify(keys, "phone", "alice", 1)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
