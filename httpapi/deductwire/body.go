package deductwire

// scanDeduct reads a deduct body of the shape nearly every client sends:
// one JSON object whose keys are among user, qty and request_id, each at
// most once, with string values that hold no escape and a qty of plain
// digits, whitespace anywhere JSON allows it. ok is false for anything
// else (another key, an escape, a repeated key, a qty of another form, a
// value of another type, bytes after the object), which the caller then
// reads with the full parser: the two agree wherever this one answers
// (FuzzScanDeduct_AgreesWithTheParser). It saves a sold-out answer the
// parser's tree, a few hundred nanoseconds of the ten or so it costs.
//
// The byte slices point into body; has* report which keys were present.
func scanDeduct(body []byte) (f deductBody, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return f, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return f, skipSpace(body, i+1) == len(body)
	}
	for {
		key, next, ok := scanString(body, i)
		if !ok {
			return f, false
		}
		i = skipSpace(body, next)
		if i >= len(body) || body[i] != ':' {
			return f, false
		}
		i = skipSpace(body, i+1)
		switch string(key) {
		case keyUser, keyRequestID:
			v, next, ok := scanString(body, i)
			if !ok {
				return f, false
			}
			if string(key) == keyUser {
				if f.hasUser {
					return f, false
				}
				f.user, f.hasUser = v, true
			} else {
				if f.hasRequestID {
					return f, false
				}
				f.requestID, f.hasRequestID = v, true
			}
			i = next
		case keyQty:
			n, next, ok := scanDigits(body, i)
			if !ok || f.hasQty {
				return f, false
			}
			f.qty, f.hasQty = n, true
			i = next
		default:
			return f, false
		}
		i = skipSpace(body, i)
		if i >= len(body) {
			return f, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return f, skipSpace(body, i+1) == len(body)
		default:
			return f, false
		}
	}
}

// deductBody is a deduct's fields as scanDeduct found them.
type deductBody struct {
	user, requestID               []byte
	qty                           int64
	hasUser, hasRequestID, hasQty bool
}

// skipSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanString reads a string without escapes starting at b[i] (its
// opening quote): its bytes and the index after its closing quote.
func scanString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '"':
			return b[i+1 : j], j + 1, true
		case '\\':
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// scanDigits reads a number of at most 18 digits without a leading zero
// (or a lone 0) starting at b[i]: no sign, fraction or exponent.
func scanDigits(b []byte, i int) (n int64, next int, ok bool) {
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		n = n*10 + int64(b[j]-'0')
		j++
	}
	switch {
	case j == i, j-i > 18, b[i] == '0' && j-i > 1:
		return 0, 0, false
	case j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E'):
		return 0, 0, false
	}
	return n, j, true
}
