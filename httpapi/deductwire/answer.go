package deductwire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
)

// ContentTypeJSON is every answer's content type.
const ContentTypeJSON = "application/json"

// StatusTooEarly is 425, which fasthttp names no constant for.
const StatusTooEarly = 425

// ServerName is the Server header of every answer (fasthttp's Server.Name
// at the handlers' door).
const ServerName = "stockd"

// Precomputed answers: the common losing outcomes and refusals.
var (
	BodySoldOut     = PrecomputedError("sold_out", "no units left")
	BodyUserLimit   = PrecomputedError("user_limit", "this user has bought the most units the sale allows")
	BodyUnknownSKU  = PrecomputedError("unknown_sku", "no sale with this sku")
	BodyClosed      = PrecomputedError("closed", "the sale is closed")
	BodyLotterySale = PrecomputedError("lottery_sale", "this sale is a lottery: POST /v1/skus/{sku}/enter")
	BodyRateLimited = PrecomputedError("rate_limited", "too many requests; retry after the given seconds")
	BodyTryAgain    = PrecomputedError("try_again", "the last units are still held by other nodes; retry after the given seconds")
	BodyBadJSON     = PrecomputedError("bad_request", `body must be a JSON object {"user": string, "qty": integer, "request_id": string}`)
	BodyBadUser     = PrecomputedError("bad_request", "user must be a string of 1 to 128 bytes of UTF-8 text without control characters")
	BodyBadQty      = PrecomputedError("bad_request", "qty must be an integer from 1 to "+strconv.Itoa(engine.MaxQtyPerDeduct)+", written as one (no fraction, exponent or leading zero)")
	BodyBadReqID    = PrecomputedError("bad_request", "request_id must be a string of at most 128 bytes of UTF-8 text without control characters")
	BodyEmptyReqID  = PrecomputedError("bad_request", "request_id is empty: leave the field out for a call without one")
	BodyBadIdemKey  = PrecomputedError("bad_request", "the Idempotency-Key header and the body's request_id differ: send one, or both the same")
	// BodyEmptyIdemKey and BodyRepeatedIdemKey: the header must name one
	// request id.
	BodyEmptyIdemKey    = PrecomputedError("bad_request", "the Idempotency-Key header is empty: leave it out for a call without a request id")
	BodyRepeatedIdemKey = PrecomputedError("bad_request", "the Idempotency-Key header is given more than once: send it once")
	BodyTooManyArgs     = PrecomputedError("bad_request", "the query carries more than 32 arguments")
	// BodyEntryQty: a lottery entry is one per user, for no quantity.
	BodyEntryQty = PrecomputedError("bad_request", "an entry takes no qty: one entry a user")
	// BodyBadBatch answers a batch body that is not one.
	BodyBadBatch = PrecomputedError("bad_request", `the body must be a JSON object with a "deducts" array of at most 1000 objects`)
	BodyReused   = PrecomputedError("request_id_reused", "this user already used this request_id for another sku or qty (or a lottery entry); nothing changed: use a new request_id for a new purchase")
	BodyBadSKU   = PrecomputedError("bad_request", "sku must be 1 to 128 letters, digits or . _ - :")
	BodyBadWait  = PrecomputedError("bad_request", "wait must be commit or none")
	// The waiting room's token: its form on the wire, then the engine's
	// refusals.
	BodyBadToken          = PrecomputedError("bad_request", "admission_token (or the Stockd-Admission header) must be a string of 1 to 512 bytes of text, given once")
	BodyTokenDiffers      = PrecomputedError("bad_request", "the Stockd-Admission header and the body's admission_token differ: send one, or both the same")
	BodyAdmissionRequired = PrecomputedError("admission_required", "this sale sells to buyers its waiting room admitted: POST /v1/skus/{sku}/queue, then deduct with the ticket's admission_token")
	// BodyNeedServiceToken answers 401 a call without the service
	// credential.
	BodyNeedServiceToken = PrecomputedError("unauthorized", "this call needs Authorization: Bearer <service token>")
)

// Answer is one HTTP answer: its status, JSON body and, for 425 and 429,
// the Retry-After seconds. Body is precomputed or built in a caller's
// buffer; neither may change while the answer is written.
type Answer struct {
	Status     int
	Body       []byte
	RetryAfter int64
}

// Refusal is the answer to a request read refused (Reader.Read's status
// and body).
func Refusal(status int, body []byte) Answer { return Answer{Status: status, Body: body} }

// Result is the answer to a deduct's result, its body built in buf when
// not precomputed.
func Result(res *engine.DeductResult, buf []byte) Answer {
	switch res.Status {
	case engine.StatusOK, engine.StatusAccepted:
		code := fasthttp.StatusOK
		if res.Status == engine.StatusAccepted {
			code = fasthttp.StatusAccepted
		}
		b := buf
		b = append(b, `{"order_id":`...)
		b = AppendJSONString(b, res.Order.ID)
		b = append(b, `,"state":`...)
		b = AppendJSONString(b, string(res.Order.State))
		b = append(b, `,"sku":`...)
		b = AppendJSONString(b, res.Order.SKU)
		b = append(b, `,"qty":`...)
		b = strconv.AppendInt(b, res.Order.Qty, 10)
		if res.Order.ExpiresAtUnixNano != 0 {
			b = append(b, `,"expires_at":`...)
			b = AppendJSONString(b, time.Unix(0, res.Order.ExpiresAtUnixNano).UTC().Format(time.RFC3339Nano))
		}
		return Answer{Status: code, Body: append(b, "}\n"...)}
	case engine.StatusSoldOut:
		if res.Detail != "" {
			return Answer{Status: fasthttp.StatusConflict, Body: ErrorJSON(buf, "sold_out", res.Detail)}
		}
		return Answer{Status: fasthttp.StatusConflict, Body: BodySoldOut}
	case engine.StatusUserLimit:
		return Answer{Status: fasthttp.StatusConflict, Body: BodyUserLimit}
	case engine.StatusUnknownSKU:
		return Answer{Status: fasthttp.StatusNotFound, Body: BodyUnknownSKU}
	case engine.StatusClosed:
		return Answer{Status: fasthttp.StatusConflict, Body: BodyClosed}
	case engine.StatusLotterySale:
		return Answer{Status: fasthttp.StatusConflict, Body: BodyLotterySale}
	case engine.StatusRequestIDReused:
		return Answer{Status: fasthttp.StatusUnprocessableEntity, Body: BodyReused}
	case engine.StatusAdmissionRequired:
		return Answer{Status: fasthttp.StatusForbidden, Body: BodyAdmissionRequired}
	case engine.StatusAdmissionInvalid:
		return Answer{Status: fasthttp.StatusForbidden, Body: ErrorJSON(buf, "admission_invalid", res.Detail)}
	case engine.StatusNotStarted:
		left := time.Until(res.StartAt)
		b, _ := MarshalLine(map[string]any{
			"error": "not_started", "detail": "the sale opens at start_at",
			"start_at": res.StartAt.UTC().Format(time.RFC3339Nano), "starts_in_ms": left.Milliseconds(),
		})
		return Answer{Status: StatusTooEarly, Body: b, RetryAfter: int64(left.Seconds()) + 1}
	case engine.StatusRateLimited, engine.StatusTryAgain:
		// Retry-After is in whole seconds; round up so a client never
		// comes back early.
		secs := max(int64((res.RetryAfter+time.Second-1)/time.Second), 1)
		if res.Status == engine.StatusTryAgain {
			return Answer{Status: fasthttp.StatusTooManyRequests, Body: BodyTryAgain, RetryAfter: secs}
		}
		return Answer{Status: fasthttp.StatusTooManyRequests, Body: BodyRateLimited, RetryAfter: secs}
	case engine.StatusBadRequest:
		return Answer{Status: fasthttp.StatusBadRequest, Body: BodyBadQty}
	case engine.StatusOutcomeUnknown:
		return Answer{Status: fasthttp.StatusGatewayTimeout, Body: ErrorJSON(buf, "outcome_unknown", res.Detail)}
	}
	return Answer{Status: fasthttp.StatusServiceUnavailable, Body: ErrorJSON(buf, "unavailable", res.Detail)}
}

// WriteTo sets resp to the answer (the handlers' door; fasthttp frames
// it). The body is copied.
func (a *Answer) WriteTo(resp *fasthttp.Response) {
	resp.SetStatusCode(a.Status)
	resp.Header.SetContentType(ContentTypeJSON)
	if a.RetryAfter > 0 {
		resp.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(a.RetryAfter, 10))
	}
	resp.SetBody(a.Body)
}

// AppendHTTP appends the answer framed as HTTP/1.1 to dst, byte for byte
// as the handlers' fasthttp server frames what WriteTo set (the event
// loop's door; httpapi/eventloop's TestDoors_AnswerTheSameRequestsAlike holds them together),
// with Connection: close when closeConn.
func (a *Answer) AppendHTTP(dst []byte, closeConn bool) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(a.Status), 10)
	dst = append(dst, ' ')
	dst = append(dst, fasthttp.StatusMessage(a.Status)...)
	dst = append(dst, "\r\nServer: "+ServerName+"\r\nContent-Type: "+ContentTypeJSON+"\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(a.Body)), 10)
	if a.RetryAfter > 0 {
		dst = append(dst, "\r\nRetry-After: "...)
		dst = strconv.AppendInt(dst, a.RetryAfter, 10)
	}
	if closeConn {
		dst = append(dst, "\r\nConnection: close"...)
	}
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, a.Body...)
}

// bodyMiscased is the 400 answer to a key that is field in other letter
// case.
func bodyMiscased(field string) []byte {
	return ErrorJSON(nil, "bad_request", field+" is written in other letter case: field names are lower case")
}

// bodyRepeated is the 400 answer to a body that gives field twice.
func bodyRepeated(field string) []byte {
	switch field {
	case keyUser:
		return bodyRepeatedUser
	case keyQty:
		return bodyRepeatedQty
	case keyRequestID:
		return bodyRepeatedReqID
	case keySKU:
		return bodyRepeatedSKU
	}
	return bodyRepeatedDeducts
}

var (
	bodyRepeatedUser    = PrecomputedError("bad_request", "user is given more than once in the body: send it once")
	bodyRepeatedQty     = PrecomputedError("bad_request", "qty is given more than once in the body: send it once")
	bodyRepeatedReqID   = PrecomputedError("bad_request", "request_id is given more than once in the body: send it once")
	bodyRepeatedSKU     = PrecomputedError("bad_request", "sku is given more than once in the item: send it once")
	bodyRepeatedDeducts = PrecomputedError("bad_request", "deducts is given more than once in the body: send it once")
)

// errorBody is the contract's error shape.
type errorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail,omitempty"`
}

// PrecomputedError is an error body made once, for an answer given often.
func PrecomputedError(errCode, detail string) []byte {
	b, _ := MarshalLine(errorBody{Error: errCode, Detail: detail})
	return b
}

// MarshalLine encodes v as one line of JSON that reads as written: `<`,
// `>` and `&` stay themselves (encoding/json escapes them for HTML pages
// by default, and an answer is no page).
func MarshalLine(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ErrorJSON appends an error body to buf.
func ErrorJSON(buf []byte, errCode, detail string) []byte {
	buf = append(buf, `{"error":`...)
	buf = AppendJSONString(buf, errCode)
	buf = append(buf, `,"detail":`...)
	buf = AppendJSONString(buf, detail)
	return append(buf, "}\n"...)
}

// AppendJSONString appends s as a JSON string literal.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
