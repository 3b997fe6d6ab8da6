package deductwire

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"stockd.dev/stockd/engine"
)

// A deduct's body has one meaning or is refused. The reader here follows
// RFC 8259 to the letter (no leading zeros, no raw control characters in
// strings, valid UTF-8, escapes decoded, lone surrogates refused) and
// refuses what JSON allows but could be read two ways: a field given
// twice, a qty that is not written as an integer, an id that reads back
// otherwise than it was sent (control characters, an empty request id).
// Keys it does not know are checked as JSON and otherwise ignored. One
// pass, no allocation once a Reader's scratch has grown; what it returns
// points into the body, or into the scratch when a value had escapes.

// The fields of a deduct (and of a batch item, which adds sku).
const (
	keyUser      = "user"
	keyQty       = "qty"
	keyRequestID = "request_id"
	keySKU       = "sku"
	keyToken     = "admission_token"
)

// jsonDepthMax bounds the nesting of a value under a key the reader
// ignores: a deduct's body is flat, and a deep one is a probe.
const jsonDepthMax = 16

// deductBody is a deduct's fields as the body gave them.
type deductBody struct {
	user, requestID, sku, token                     []byte
	qty                                             int64
	hasUser, hasRequestID, hasQty, hasSKU, hasToken bool
}

// lexer reads one JSON text. Its methods return the index after what
// they read, or -1 when the bytes are not JSON.
type lexer struct {
	b       []byte
	scratch *[]byte // decoded strings with escapes go here
	// loose finds where a value ends without judging it (a batch's items,
	// which are then read one by one, so that a bad one is answered
	// alone, naming its field): strings are not decoded, numbers not
	// checked.
	loose bool
}

func (x *lexer) space(i int) int {
	for i < len(x.b) && (x.b[i] == ' ' || x.b[i] == '\n' || x.b[i] == '\r' || x.b[i] == '\t') {
		i++
	}
	return i
}

// str reads a string at x.b[i] (its opening quote) and returns its
// decoded bytes: a view of the body when it has no escape, else a part of
// the scratch (which only grows while a body is read, so earlier views
// stay as they were).
func (x *lexer) str(i int) (s []byte, next int) {
	if i >= len(x.b) || x.b[i] != '"' {
		return nil, -1
	}
	start, from := i+1, -1 // from: where the decoded copy starts in the scratch
	for j := start; j < len(x.b); {
		c := x.b[j]
		if x.loose {
			switch c {
			case '"':
				return nil, j + 1
			case '\\':
				j++
			}
			j++
			continue
		}
		switch {
		case c == '"':
			if from < 0 {
				return x.b[start:j], j + 1
			}
			return (*x.scratch)[from:], j + 1
		case c < 0x20:
			return nil, -1 // JSON forbids raw control characters
		case c == '\\':
			if from < 0 {
				from = len(*x.scratch)
				*x.scratch = append(*x.scratch, x.b[start:j]...)
			}
			var ok bool
			if *x.scratch, j, ok = x.escape(*x.scratch, j); !ok {
				return nil, -1
			}
		case c < utf8.RuneSelf:
			if from >= 0 {
				*x.scratch = append(*x.scratch, c)
			}
			j++
		default:
			r, size := utf8.DecodeRune(x.b[j:])
			if r == utf8.RuneError && size <= 1 {
				return nil, -1 // not UTF-8: it would read back as U+FFFD
			}
			if from >= 0 {
				*x.scratch = append(*x.scratch, x.b[j:j+size]...)
			}
			j += size
		}
	}
	return nil, -1
}

// escape decodes the escape at x.b[j] (a backslash) onto out.
func (x *lexer) escape(out []byte, j int) ([]byte, int, bool) {
	if j+1 >= len(x.b) {
		return out, j, false
	}
	switch e := x.b[j+1]; e {
	case '"', '\\', '/':
		return append(out, e), j + 2, true
	case 'b':
		return append(out, '\b'), j + 2, true
	case 'f':
		return append(out, '\f'), j + 2, true
	case 'n':
		return append(out, '\n'), j + 2, true
	case 'r':
		return append(out, '\r'), j + 2, true
	case 't':
		return append(out, '\t'), j + 2, true
	case 'u':
		r, ok := hex4(x.b, j+2)
		if !ok {
			return out, j, false
		}
		j += 6
		if r >= 0xd800 && r < 0xdc00 {
			// A high surrogate must be followed by a low one.
			if j+1 >= len(x.b) || x.b[j] != '\\' || x.b[j+1] != 'u' {
				return out, j, false
			}
			lo, ok := hex4(x.b, j+2)
			if !ok || lo < 0xdc00 || lo >= 0xe000 {
				return out, j, false
			}
			r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			j += 6
		} else if r >= 0xdc00 && r < 0xe000 {
			return out, j, false // a lone low surrogate
		}
		return utf8.AppendRune(out, r), j, true
	}
	return out, j, false
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number reads a JSON number at x.b[i]; integer reports that it has no
// fraction or exponent, n its value then (when it fits in 18 digits).
func (x *lexer) number(i int) (n int64, integer bool, next int) {
	j := i
	if j < len(x.b) && x.b[j] == '-' {
		j++
	}
	digits := j
	for j < len(x.b) && x.b[j] >= '0' && x.b[j] <= '9' {
		j++
	}
	switch {
	case j == digits:
		return 0, false, -1
	case x.b[digits] == '0' && j-digits > 1 && !x.loose:
		return 0, false, -1 // a leading zero is not JSON
	}
	integer = digits == i && j-digits <= 18
	if integer {
		for _, c := range x.b[digits:j] {
			n = n*10 + int64(c-'0')
		}
	}
	if j < len(x.b) && x.b[j] == '.' {
		k := j + 1
		for k < len(x.b) && x.b[k] >= '0' && x.b[k] <= '9' {
			k++
		}
		if k == j+1 {
			return 0, false, -1
		}
		j, integer = k, false
	}
	if j < len(x.b) && (x.b[j] == 'e' || x.b[j] == 'E') {
		k := j + 1
		if k < len(x.b) && (x.b[k] == '+' || x.b[k] == '-') {
			k++
		}
		d := k
		for k < len(x.b) && x.b[k] >= '0' && x.b[k] <= '9' {
			k++
		}
		if k == d {
			return 0, false, -1
		}
		j, integer = k, false
	}
	return n, integer, j
}

// skip reads any JSON value at x.b[i] and returns the index after it.
func (x *lexer) skip(i, depth int) int {
	if i >= len(x.b) || depth > jsonDepthMax {
		return -1
	}
	switch c := x.b[i]; {
	case c == '"':
		_, next := x.str(i)
		return next
	case c == '-' || (c >= '0' && c <= '9'):
		_, _, next := x.number(i)
		return next
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i = x.space(i + 1)
		if i < len(x.b) && x.b[i] == end {
			return i + 1
		}
		for {
			if c == '{' {
				if _, i = x.str(i); i < 0 {
					return -1
				}
				if i = x.space(i); i >= len(x.b) || x.b[i] != ':' {
					return -1
				}
				i = x.space(i + 1)
			}
			if i = x.skip(i, depth+1); i < 0 {
				return -1
			}
			i = x.space(i)
			if i >= len(x.b) {
				return -1
			}
			switch x.b[i] {
			case ',':
				i = x.space(i + 1)
			case end:
				return i + 1
			default:
				return -1
			}
		}
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(x.b)-i >= len(lit) && string(x.b[i:i+len(lit)]) == lit {
			return i + len(lit)
		}
	}
	return -1
}

// object reads the object at x.b[i] member by member: member reads the
// value of key at index j and returns the index after it, or an answer
// that ends the read. It returns the index after the object, or the
// answer (malformed for bytes that are not an object).
func (x *lexer) object(i int, malformed []byte, member func(key []byte, j int) (int, []byte)) (int, []byte) {
	if i >= len(x.b) || x.b[i] != '{' {
		return -1, malformed
	}
	if i = x.space(i + 1); i < len(x.b) && x.b[i] == '}' {
		return i + 1, nil
	}
	for {
		var key []byte
		if key, i = x.str(i); i < 0 {
			return -1, malformed
		}
		if i = x.space(i); i >= len(x.b) || x.b[i] != ':' {
			return -1, malformed
		}
		var bad []byte
		if i, bad = member(key, x.space(i+1)); bad != nil {
			return -1, bad
		}
		if i = x.space(i); i >= len(x.b) {
			return -1, malformed
		}
		switch x.b[i] {
		case '}':
			return i + 1, nil
		case ',':
			i = x.space(i + 1)
		default:
			return -1, malformed
		}
	}
}

// readDeduct reads a deduct's body (a batch item's when withSKU): its
// fields, or the 400 answer that names what is wrong.
func readDeduct(body []byte, scratch *[]byte, withSKU bool) (f deductBody, bad []byte) {
	x := lexer{b: body, scratch: scratch}
	end, bad := x.object(x.space(0), BodyBadJSON, func(key []byte, j int) (int, []byte) {
		return f.field(&x, key, j, withSKU)
	})
	switch {
	case bad != nil:
		return f, bad
	case x.space(end) != len(body):
		return f, BodyBadJSON
	}
	return f, f.check(withSKU)
}

// field reads the value of key at x.b[i] into f.
func (f *deductBody) field(x *lexer, key []byte, i int, withSKU bool) (int, []byte) {
	var dup bool
	var next int
	// text reads a string field into dst; badValue is its answer to a
	// value that is not text.
	text := func(dst *[]byte, has *bool, badValue []byte) []byte {
		dup = *has
		if *dst, next = x.str(i); next < 0 {
			return bodyNotJSONOr(x, i, badValue)
		}
		*has = true
		return nil
	}
	switch {
	case string(key) == keyUser:
		if bad := text(&f.user, &f.hasUser, BodyBadUser); bad != nil {
			return -1, bad
		}
	case string(key) == keyRequestID:
		if bad := text(&f.requestID, &f.hasRequestID, BodyBadReqID); bad != nil {
			return -1, bad
		}
	case string(key) == keyToken:
		if bad := text(&f.token, &f.hasToken, BodyBadToken); bad != nil {
			return -1, bad
		}
	case string(key) == keySKU && withSKU:
		if bad := text(&f.sku, &f.hasSKU, BodyBadSKU); bad != nil {
			return -1, bad
		}
	case string(key) == keyQty:
		dup = f.hasQty
		var integer bool
		if f.qty, integer, next = x.number(i); next < 0 {
			return -1, BodyBadQty // another type, or a number JSON does not allow (01)
		}
		if !integer {
			return -1, BodyBadQty
		}
		f.hasQty = true
	default:
		if known := caseOf(key); known != "" {
			// Decoders that match keys without regard to case (Go's
			// encoding/json among them) read "Request_id" as request_id:
			// ignored here, it would mean a call without one.
			return -1, bodyMiscased(known)
		}
		if next = x.skip(i, 0); next < 0 {
			return -1, BodyBadJSON
		}
		return next, nil
	}
	if dup {
		return -1, bodyRepeated(string(key))
	}
	return next, nil
}

// caseOf is the field key names in other letter case ("" for none).
func caseOf(key []byte) string {
	for _, k := range [...]string{keyUser, keyQty, keyRequestID, keySKU, keyToken} {
		if string(key) != k && strings.EqualFold(string(key), k) {
			return k
		}
	}
	return ""
}

// bodyNotJSONOr is the answer to a known field whose value is not what
// it must be: the field's own answer (a value of another type, a string
// that is not text: invalid UTF-8, a lone surrogate, a raw control
// character), or BodyBadJSON when the value is not JSON of any kind.
func bodyNotJSONOr(x *lexer, i int, fieldBad []byte) []byte {
	if i < len(x.b) && x.b[i] == '"' || x.skip(i, 0) >= 0 {
		return fieldBad
	}
	return BodyBadJSON
}

// check applies the id rules and the qty's bounds to fields read.
func (f *deductBody) check(withSKU bool) []byte {
	switch {
	case !f.hasUser || !ValidUserID(f.user):
		return BodyBadUser
	case f.hasRequestID && len(f.requestID) == 0:
		return BodyEmptyReqID
	case !ValidRequestID(f.requestID):
		return BodyBadReqID
	case withSKU && (!f.hasSKU || !ValidID(f.sku)):
		return BodyBadSKU
	case f.hasToken && (len(f.token) == 0 || len(f.token) > MaxTokenBytes || !cleanText(f.token)):
		return BodyBadToken
	}
	if !f.hasQty {
		f.qty = 1
	} else if f.qty < 1 || f.qty > engine.MaxQtyPerDeduct {
		return BodyBadQty
	}
	return nil
}

// ValidUserID reports whether b is a user id: 1 to MaxIDBytes bytes of
// UTF-8 text without control characters (e-mail addresses and names
// included). It reads back as it was sent, on every route.
func ValidUserID(b []byte) bool {
	return len(b) > 0 && len(b) <= MaxIDBytes && cleanText(b)
}

// ValidRequestID reports whether id is a request id, or none (empty):
// at most MaxIDBytes bytes of UTF-8 text without control characters.
// (An empty request_id field is refused before: only an absent one means
// none.)
func ValidRequestID(id []byte) bool {
	return len(id) <= MaxIDBytes && cleanText(id)
}

// cleanText reports whether b is valid UTF-8 (an invalid byte would read
// back as U+FFFD, the same as that character sent) without control
// characters (C0, DEL, C1).
func cleanText(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || unicode.IsControl(r) {
			return false
		}
		i += size
	}
	return true
}
