package httpapi

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

const contentTypeJSON = "application/json"

// errorBody is the contract's error shape.
type errorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail,omitempty"`
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = fasthttp.StatusInternalServerError, []byte(`{"error":"internal","detail":"encode response"}`)
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(append(b, '\n'))
}

func writeError(ctx *fasthttp.RequestCtx, code int, errCode, detail string) {
	writeJSON(ctx, code, errorBody{Error: errCode, Detail: detail})
}

// writeRaw writes a precomputed body: the answers losers get, with no
// encoding and no allocation.
func writeRaw(ctx *fasthttp.RequestCtx, code int, body []byte) {
	ctx.SetStatusCode(code)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(body)
}

func precomputedError(errCode, detail string) []byte {
	b, _ := json.Marshal(errorBody{Error: errCode, Detail: detail})
	return append(b, '\n')
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
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

func appendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
