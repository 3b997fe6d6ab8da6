// Package queuetoken is the waiting room's admission token: what the
// leader's admission of a ticket lets its buyer present at the deduct, and
// how any node checks it without a lookup.
//
// A token names the ticket it admits (its public id, the SHA-256 of the
// ticket's secret), the moment it stops being valid, and the key that
// signed it; its MAC is HMAC-SHA-256 under that key over the sale, the
// user, the ticket id, the expiry and the key's number. The keys live in
// the ledger and rotate; a token verifies while its key is the ledger's
// current or previous one. Every node computes the same token from the
// same admission, so the token itself never travels through the log.
//
// The wire form is base64url without padding, read strictly: one token
// has exactly one spelling (Parse then String gives back the input).
package queuetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes of a token's parts.
const (
	version   = 1
	IDSize    = sha256.Size // a ticket id
	KeySize   = 32          // a signing key
	macSize   = sha256.Size
	rawSize   = 1 + 4 + 8 + IDSize + macSize
	WireSize  = (rawSize*8 + 5) / 6 // the wire form's length
	macDomain = "stockd queue token v1"
)

// Errors of Parse and Verify. Every refusal is one of them, so the deduct
// can answer 403 admission_invalid with the reason in its metrics.
var (
	ErrMalformed  = errors.New("not an admission token")
	ErrUnknownKey = errors.New("signed by a key that rotated out")
	ErrForged     = errors.New("signature does not match the sale, user and ticket")
	ErrExpired    = errors.New("expired")
)

// Token is a parsed admission token.
type Token struct {
	KeyID           uint32
	ExpiresUnixNano int64
	TicketID        [IDSize]byte
	MAC             [macSize]byte
}

// Key is one signing key of the ledger's: its number (rotations count up)
// and its bytes.
type Key struct {
	ID    uint32
	Bytes []byte
}

// Sign makes the token that admits ticketID to buy sku as user until
// expiresUnixNano, under key.
func Sign(key Key, sku, user string, ticketID [IDSize]byte, expiresUnixNano int64) Token {
	t := Token{KeyID: key.ID, ExpiresUnixNano: expiresUnixNano, TicketID: ticketID}
	t.MAC = mac(key, sku, user, &t)
	return t
}

func mac(key Key, sku, user string, t *Token) [macSize]byte {
	h := hmac.New(sha256.New, key.Bytes)
	var b []byte
	b = append(b, macDomain...)
	b = binary.AppendUvarint(b, uint64(len(sku)))
	b = append(b, sku...)
	b = binary.AppendUvarint(b, uint64(len(user)))
	b = append(b, user...)
	b = append(b, t.TicketID[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(t.ExpiresUnixNano))
	b = binary.BigEndian.AppendUint32(b, t.KeyID)
	h.Write(b)
	var out [macSize]byte
	h.Sum(out[:0])
	return out
}

// String is the token's wire form.
func (t Token) String() string {
	raw := make([]byte, 0, rawSize)
	raw = append(raw, version)
	raw = binary.BigEndian.AppendUint32(raw, t.KeyID)
	raw = binary.BigEndian.AppendUint64(raw, uint64(t.ExpiresUnixNano))
	raw = append(raw, t.TicketID[:]...)
	raw = append(raw, t.MAC[:]...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

var strict = base64.RawURLEncoding.Strict()

// Parse reads a token's wire form. It checks the form alone; Verify
// checks what the token claims.
func Parse(s string) (Token, error) {
	if len(s) != WireSize {
		return Token{}, fmt.Errorf("%w: %d characters, want %d", ErrMalformed, len(s), WireSize)
	}
	raw, err := strict.DecodeString(s)
	if err != nil || len(raw) != rawSize {
		return Token{}, fmt.Errorf("%w: not base64url", ErrMalformed)
	}
	if raw[0] != version {
		return Token{}, fmt.Errorf("%w: version %d", ErrMalformed, raw[0])
	}
	var t Token
	t.KeyID = binary.BigEndian.Uint32(raw[1:5])
	t.ExpiresUnixNano = int64(binary.BigEndian.Uint64(raw[5:13]))
	copy(t.TicketID[:], raw[13:13+IDSize])
	copy(t.MAC[:], raw[13+IDSize:])
	if t.ExpiresUnixNano <= 0 {
		return Token{}, fmt.Errorf("%w: no expiry", ErrMalformed)
	}
	return t, nil
}

// Verify checks that t admits user to sku at nowUnixNano under one of
// keys (the ledger's current and previous): the key is known, the MAC is
// the one that key gives the sale, user and ticket, and the token has not
// expired. It does not know whether the ticket already bought: the
// ledger makes a token single-use.
func (t Token) Verify(keys []Key, sku, user string, nowUnixNano int64) error {
	var key *Key
	for i := range keys {
		if keys[i].ID == t.KeyID && len(keys[i].Bytes) > 0 {
			key = &keys[i]
			break
		}
	}
	if key == nil {
		return ErrUnknownKey
	}
	want := mac(*key, sku, user, &t)
	if !hmac.Equal(want[:], t.MAC[:]) {
		return ErrForged
	}
	if nowUnixNano >= t.ExpiresUnixNano {
		return ErrExpired
	}
	return nil
}

// TicketID is the public name of a ticket whose secret is secret: the
// SHA-256 of the secret's bytes.
func TicketID(secret string) [IDSize]byte {
	return sha256.Sum256([]byte(secret))
}

// Reason names a refusal of Parse or Verify for metrics: malformed,
// forged, expired or key_rotated_out.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrUnknownKey):
		return "key_rotated_out"
	case errors.Is(err, ErrForged):
		return "forged"
	case errors.Is(err, ErrExpired):
		return "expired"
	}
	return "malformed"
}
