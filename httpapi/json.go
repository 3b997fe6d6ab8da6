package httpapi

import (
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/httpapi/deductwire"
)

const contentTypeJSON = deductwire.ContentTypeJSON

// errorBody is the contract's error shape.
type errorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail,omitempty"`
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := deductwire.MarshalLine(v)
	if err != nil {
		code, b = fasthttp.StatusInternalServerError, []byte(`{"error":"internal","detail":"encode response"}`+"\n")
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(b)
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
	return deductwire.PrecomputedError(errCode, detail)
}

func appendJSONString(dst []byte, s string) []byte { return deductwire.AppendJSONString(dst, s) }

func appendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
