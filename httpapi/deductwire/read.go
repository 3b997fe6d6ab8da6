package deductwire

import (
	"bytes"
	"crypto/subtle"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"stockd/engine"
)

// Limits of the wire format, each with its reason.
const (
	// MaxBodyBytes bounds a request body: the largest valid body (a sale
	// config) is well under 1 KiB.
	MaxBodyBytes = 16 << 10
	// MaxIDBytes bounds SKUs, users, request ids and order ids: ids, not
	// documents.
	MaxIDBytes = 128
)

var (
	pathSKUs     = []byte("/v1/skus/")
	suffixDeduct = []byte("/deduct")
	// infixEntries routes /v1/skus/{sku}/entries/{user} to the lottery,
	// whatever follows it: it goes before every suffix.
	infixEntries = []byte("/entries/")
	argWait      = []byte("wait")
	bearerPrefix = []byte("Bearer ")

	keyUser      = "user"
	keyQty       = "qty"
	keyRequestID = "request_id"
)

// HeaderIdempotencyKey may carry a deduct's (or a lottery entry's)
// request id instead of the body's request_id field.
const HeaderIdempotencyKey = "Idempotency-Key"

// DeductSKU reports whether path (decoded, as fasthttp's URI gives it) is
// a single deduct's route, and its SKU segment (not yet checked: Read
// answers a bad one).
func DeductSKU(path []byte) (sku []byte, ok bool) {
	rest, ok := bytes.CutPrefix(path, pathSKUs)
	if !ok || bytes.Contains(rest, infixEntries) {
		return nil, false
	}
	return bytes.CutSuffix(rest, suffixDeduct)
}

// Credentials are what a node checks on the routes a shop's service calls
// (deducts, orders, confirm and cancel, the feed).
type Credentials struct {
	// ServiceToken, when set, is required as a bearer token; the admin
	// token passes too.
	ServiceToken string
	AdminToken   string
	// ClientCerts: the listener verified a client certificate in the
	// handshake (-http-client-ca); it stands in for the token.
	ClientCerts bool
}

// Service reports whether a call whose Authorization header is auth may
// use the service routes. A few byte compares, no allocation.
func (c *Credentials) Service(auth []byte) bool {
	if c.ClientCerts || c.ServiceToken == "" {
		return true
	}
	token, ok := bytes.CutPrefix(auth, bearerPrefix)
	return ok && (subtle.ConstantTimeCompare(token, []byte(c.ServiceToken)) == 1 ||
		(c.AdminToken != "" && subtle.ConstantTimeCompare(token, []byte(c.AdminToken)) == 1))
}

// Reader reads deducts. One goroutine uses a Reader at a time (the loop
// has one; the handlers take one from a pool); what Read returns points
// into the request and the Reader until its next Read.
type Reader struct {
	parser fastjson.Parser
}

// Read reads the deduct in req, whose path DeductSKU matched with sku,
// into dst (every field but Hint): status 0 when dst is a deduct to run,
// else the status and body of the answer to give instead (400: a bad SKU,
// wait argument, body or Idempotency-Key). The credentials are checked
// before, by the caller (Credentials.Service).
func (r *Reader) Read(req *fasthttp.Request, sku []byte, dst *engine.DeductRequest) (status int, bad []byte) {
	if !ValidID(sku) {
		return fasthttp.StatusBadRequest, BodyBadSKU
	}
	noWait, bad := Wait(req.URI().QueryArgs())
	if bad != nil {
		return fasthttp.StatusBadRequest, bad
	}
	var user, requestID []byte
	var qty int64
	if f, ok := scanDeduct(req.Body()); ok {
		user, requestID, qty, bad = f.check()
	} else {
		v, err := r.parser.ParseBytes(req.Body())
		if err != nil || v.Type() != fastjson.TypeObject {
			return fasthttp.StatusBadRequest, BodyBadJSON
		}
		user, requestID, qty, bad = Fields(v)
	}
	if bad == nil {
		requestID, bad = IdempotencyKey(&req.Header, requestID)
	}
	if bad != nil {
		return fasthttp.StatusBadRequest, bad
	}
	*dst = engine.DeductRequest{SKU: sku, User: user, RequestID: requestID, Qty: qty, NoWait: noWait}
	return 0, nil
}

// Wait reads the ?wait=commit|none argument of a deduct (single or
// batch); bad is the 400 answer to another value.
func Wait(args *fasthttp.Args) (noWait bool, bad []byte) {
	switch string(args.PeekBytes(argWait)) {
	case "", "commit":
		return false, nil
	case "none":
		return true, nil
	}
	return false, BodyBadWait
}

// IdempotencyKey merges the Idempotency-Key header into the body's
// request id: the header alone names it, both must agree. bad is the 400
// answer to a header that is not a valid id or differs from the body.
func IdempotencyKey(h *fasthttp.RequestHeader, requestID []byte) ([]byte, []byte) {
	key := h.Peek(HeaderIdempotencyKey)
	switch {
	case len(key) == 0:
		return requestID, nil
	case !ValidRequestID(key):
		return nil, BodyBadReqID
	case len(requestID) > 0 && string(key) != string(requestID):
		return nil, BodyBadIdemKey
	}
	return key, nil
}

// Fields reads a deduct's user, request id and qty (absent: one unit)
// from a parsed body or batch item; bad is the 400 answer to a field that
// is not right. The byte slices point into v.
func Fields(v *fastjson.Value) (user, requestID []byte, qty int64, bad []byte) {
	user, ok := StringField(v, keyUser, true)
	if !ok || len(user) > MaxIDBytes {
		return nil, nil, 0, BodyBadUser
	}
	requestID, ok = StringField(v, keyRequestID, false)
	if !ok || !ValidRequestID(requestID) {
		return nil, nil, 0, BodyBadReqID
	}
	qty = 1
	if q := v.Get(keyQty); q != nil {
		n, err := q.Int64()
		if err != nil || q.Type() != fastjson.TypeNumber || n < 1 || n > engine.MaxQtyPerDeduct {
			return nil, nil, 0, BodyBadQty
		}
		qty = n
	}
	return user, requestID, qty, nil
}

// check is Fields for a body scanDeduct read: the same answers to the
// same values (FuzzScanDeduct_AgreesWithTheParser).
func (f *deductBody) check() (user, requestID []byte, qty int64, bad []byte) {
	if !f.hasUser || len(f.user) == 0 || len(f.user) > MaxIDBytes {
		return nil, nil, 0, BodyBadUser
	}
	if !ValidRequestID(f.requestID) {
		return nil, nil, 0, BodyBadReqID
	}
	qty = 1
	if f.hasQty {
		if f.qty < 1 || f.qty > engine.MaxQtyPerDeduct {
			return nil, nil, 0, BodyBadQty
		}
		qty = f.qty
	}
	return f.user, f.requestID, qty, nil
}

// StringField reads key as a string. A missing key is ok unless required;
// a key of another type is not.
func StringField(v *fastjson.Value, key string, required bool) ([]byte, bool) {
	f := v.Get(key)
	if f == nil {
		return nil, !required
	}
	b, err := f.StringBytes()
	if err != nil || (required && len(b) == 0) {
		return nil, false
	}
	return b, true
}

// ValidID reports whether b is a usable id: 1..MaxIDBytes of letters,
// digits and . _ - : (no slashes, so ids cannot confuse routing).
func ValidID(b []byte) bool {
	if len(b) == 0 || len(b) > MaxIDBytes {
		return false
	}
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == ':':
		default:
			return false
		}
	}
	return true
}

// ValidRequestID reports whether id is at most MaxIDBytes without control
// characters (the ledger keys user-scoped ids with a 0x00 byte in front).
func ValidRequestID(id []byte) bool {
	if len(id) > MaxIDBytes {
		return false
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}
