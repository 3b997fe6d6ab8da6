package httpapi

import (
	_ "embed"

	"github.com/valyala/fasthttp"
)

// openAPIDocument is the contract, machine-readable: an OpenAPI 3.0.3
// document of every route but /internal/* and /debug/pprof, served at
// GET /v1/openapi.json without credentials so that a service in any
// language can generate its client from a running node. openapi_test.go
// checks it is a valid document.
//
//go:embed openapi.json
var openAPIDocument []byte

func (s *Server) handleOpenAPI(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(openAPIDocument)
}
