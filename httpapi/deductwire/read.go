package deductwire

import (
	"bytes"
	"crypto/subtle"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
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
	keyDeducts   = "deducts"
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
	scratch []byte // decoded strings that had escapes, until the next Read
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
	r.scratch = r.scratch[:0]
	f, bad := readDeduct(req.Body(), &r.scratch, false)
	requestID, token := f.requestID, f.token
	if bad == nil {
		requestID, bad = IdempotencyKey(&req.Header, requestID)
	}
	if bad == nil {
		token, bad = AdmissionToken(&req.Header, token)
	}
	if bad != nil {
		return fasthttp.StatusBadRequest, bad
	}
	*dst = engine.DeductRequest{SKU: sku, User: f.user, RequestID: requestID, Qty: f.qty, NoWait: noWait, AdmissionToken: token}
	return 0, nil
}

// HeaderAdmission carries a queued sale's admission token, as the body's
// admission_token does.
const HeaderAdmission = "Stockd-Admission"

// MaxTokenBytes bounds an admission token on the wire (one is 103
// bytes; a longer one is no token).
const MaxTokenBytes = 512

// AdmissionToken merges the Stockd-Admission header into the body's
// admission_token: the header alone names it, both must agree; bad is
// the 400 answer to a header given twice, empty, not text, or unlike the
// body's.
func AdmissionToken(h *fasthttp.RequestHeader, token []byte) ([]byte, []byte) {
	var v []byte
	n := 0
	for k, val := range h.All() {
		if string(k) == HeaderAdmission {
			v, n = val, n+1
		}
	}
	switch {
	case n == 0:
		return token, nil
	case n > 1 || len(v) == 0 || len(v) > MaxTokenBytes || !cleanText(v):
		return nil, BodyBadToken
	case len(token) > 0 && string(v) != string(token):
		return nil, BodyTokenDiffers
	}
	return v, nil
}

// ReadEntry reads a lottery entry's body ({"user", "request_id"?}, or
// the request id in the Idempotency-Key header) by the deduct's rules:
// the same ids are valid, and mean the same, on both routes.
func (r *Reader) ReadEntry(req *fasthttp.Request) (user, requestID []byte, bad []byte) {
	r.scratch = r.scratch[:0]
	f, bad := readDeduct(req.Body(), &r.scratch, false)
	if bad == nil && f.hasQty {
		bad = BodyEntryQty
	}
	if bad == nil {
		requestID, bad = IdempotencyKey(&req.Header, f.requestID)
	}
	return f.user, requestID, bad
}

// queryArgsMax bounds the query arguments a request may carry: no route
// takes more than four, and finding a repeated one is quadratic.
const queryArgsMax = 32

// RepeatedArg is the 400 answer to a query that gives an argument twice
// (no argument of the contract takes several values) or carries more
// than queryArgsMax of them; nil for a query of one meaning. Both doors
// and every route apply it.
func RepeatedArg(args *fasthttp.Args) []byte {
	n := args.Len()
	if n < 2 {
		return nil
	}
	if n > queryArgsMax {
		return BodyTooManyArgs
	}
	i := 0
	for k := range args.All() {
		j := 0
		for other := range args.All() {
			if j > i && string(k) == string(other) {
				return ErrorJSON(nil, "bad_request", string(k)+" is given more than once in the query: send it once")
			}
			j++
		}
		i++
	}
	return nil
}

// Wait reads the ?wait=commit|none argument of a deduct (single or
// batch); bad is the 400 answer to another value, or to a query that
// gives an argument twice.
func Wait(args *fasthttp.Args) (noWait bool, bad []byte) {
	if bad := RepeatedArg(args); bad != nil {
		return false, bad
	}
	switch v := args.PeekBytes(argWait); {
	case string(v) == "" || string(v) == "commit":
		return false, nil
	case string(v) == "none":
		return true, nil
	}
	return false, BodyBadWait
}

// IdempotencyKey merges the Idempotency-Key header into the body's
// request id: the header alone names it, both must agree. bad is the 400
// answer to a header that is empty, given twice, not a valid id, or
// unlike the body's.
func IdempotencyKey(h *fasthttp.RequestHeader, requestID []byte) ([]byte, []byte) {
	var key []byte
	n := 0
	for k, v := range h.All() {
		if string(k) == HeaderIdempotencyKey {
			key, n = v, n+1
		}
	}
	switch {
	case n == 0:
		return requestID, nil
	case n > 1:
		return nil, BodyRepeatedIdemKey
	case len(key) == 0:
		return nil, BodyEmptyIdemKey
	case !ValidRequestID(key):
		return nil, BodyBadReqID
	case len(requestID) > 0 && string(key) != string(requestID):
		return nil, BodyBadIdemKey
	}
	return key, nil
}

// IdempotencyKeyGiven reports whether the request carries an
// Idempotency-Key header, empty or not.
func IdempotencyKeyGiven(h *fasthttp.RequestHeader) bool {
	for k := range h.All() {
		if string(k) == HeaderIdempotencyKey {
			return true
		}
	}
	return false
}

// BatchItem is one item of a batch as read: the deduct to run (its wait
// mode and hint left to the caller), or the item's 400 answer.
type BatchItem struct {
	Req engine.DeductRequest
	Bad []byte
}

// ReadBatch reads a batch body, {"deducts": [item, ...]} with at most
// maxItems items, each read as a single deduct's body is (with its sku):
// the items into dst, or the 400 answer to the whole body. What it
// returns points into body and r until the next read.
func (r *Reader) ReadBatch(body []byte, maxItems int, dst []BatchItem) ([]BatchItem, []byte) {
	r.scratch = r.scratch[:0]
	x := lexer{b: body, scratch: &r.scratch}
	seen := false
	end, bad := x.object(x.space(0), BodyBadBatch, func(key []byte, j int) (int, []byte) {
		if string(key) != keyDeducts {
			if j = x.skip(j, 0); j < 0 {
				return -1, BodyBadBatch
			}
			return j, nil
		}
		if seen {
			return -1, bodyRepeated(keyDeducts)
		}
		seen = true
		var bad []byte
		dst, j, bad = r.batchItems(&x, j, maxItems, dst)
		return j, bad
	})
	switch {
	case bad != nil:
		return dst, bad
	case !seen || x.space(end) != len(body):
		return dst, BodyBadBatch
	}
	return dst, nil
}

// batchItems reads the deducts array at x.b[i].
func (r *Reader) batchItems(x *lexer, i, maxItems int, dst []BatchItem) ([]BatchItem, int, []byte) {
	if i >= len(x.b) || x.b[i] != '[' {
		return dst, -1, BodyBadBatch
	}
	i = x.space(i + 1)
	if i < len(x.b) && x.b[i] == ']' {
		return dst, i + 1, nil
	}
	for {
		loose := lexer{b: x.b, loose: true}
		end := loose.skip(i, 0)
		if end < 0 || x.b[i] != '{' || len(dst) == maxItems {
			return dst, -1, BodyBadBatch
		}
		f, bad := readDeduct(x.b[i:end], &r.scratch, true)
		dst = append(dst, BatchItem{Req: engine.DeductRequest{SKU: f.sku, User: f.user, RequestID: f.requestID, Qty: f.qty, AdmissionToken: f.token}, Bad: bad})
		if i = x.space(end); i >= len(x.b) {
			return dst, -1, BodyBadBatch
		}
		switch x.b[i] {
		case ',':
			i = x.space(i + 1)
		case ']':
			return dst, i + 1, nil
		default:
			return dst, -1, BodyBadBatch
		}
	}
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
