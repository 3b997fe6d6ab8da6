package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/valyala/fasthttp"
)

// The contract test: every request and answer the HTTP tests of this
// package exchange with a node (through call, callWithin, postBatch,
// getRaw, callWithHeader) is recorded, and after the tests each is
// checked against GET /v1/openapi.json's document (httpapi/openapi.json):
// the route and method must be in it, the answer's status among the
// operation's, its body valid for the status's schema; a request that
// was answered 2xx must be valid for the operation too. So the document
// cannot drift from what the handlers answer.

// exchangesMax bounds what is kept: the first exchangesPerKindMax of each
// method, status and route shape, up to exchangesMax in all.
const (
	exchangesMax        = 20000
	exchangesPerKindMax = 20
)

type exchange struct {
	method, uri string
	reqHeader   http.Header
	reqBody     []byte
	status      int
	respHeader  http.Header
	respBody    []byte
}

type exchangeLog struct {
	mu     sync.Mutex
	kinds  map[string]int
	logged []exchange
}

var contractLog = &exchangeLog{kinds: map[string]int{}}

// record keeps a copy of one exchange with a node.
func (l *exchangeLog) record(req *fasthttp.Request, resp *fasthttp.Response) {
	uri := string(req.URI().RequestURI())
	path := string(req.URI().Path())
	if strings.HasPrefix(path, "/internal/") || strings.HasPrefix(path, "/debug/") {
		return
	}
	// The kind: method, status and the path's shape (its last segment
	// when it is a word, like "deduct", not an id).
	segs := strings.Split(strings.Trim(path, "/"), "/")
	last := segs[len(segs)-1]
	if strings.ContainsAny(last, "0123456789-_.:") {
		last = "*"
	}
	kind := fmt.Sprintf("%s %d %d %s %s", req.Header.Method(), resp.StatusCode(), len(segs), segs[0], last)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.logged) >= exchangesMax || l.kinds[kind] >= exchangesPerKindMax {
		return
	}
	l.kinds[kind]++
	e := exchange{method: string(req.Header.Method()), uri: uri, reqHeader: http.Header{}, respHeader: http.Header{},
		reqBody: bytes.Clone(req.Body()), status: resp.StatusCode(), respBody: bytes.Clone(resp.Body())}
	for k, v := range req.Header.All() {
		e.reqHeader.Add(string(k), string(v))
	}
	for k, v := range resp.Header.All() {
		e.respHeader.Add(string(k), string(v))
	}
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		e.respHeader.Set("Content-Type", string(ct))
	}
	l.logged = append(l.logged, e)
}

// check validates every exchange kept against the document.
func (l *exchangeLog) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.logged) == 0 {
		return nil
	}
	b, err := os.ReadFile("../httpapi/openapi.json")
	if err != nil {
		return err
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		return fmt.Errorf("load the OpenAPI document: %w", err)
	}
	doc.Servers = nil // match any host
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return fmt.Errorf("route the OpenAPI document: %w", err)
	}
	for _, ct := range []string{"application/x-ndjson", "text/html"} {
		openapi3filter.RegisterBodyDecoder(ct, func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
			b, err := io.ReadAll(r)
			return string(b), err
		})
	}
	var problems []string
	seen := map[string]bool{}
	for _, e := range l.logged {
		problem := e.validate(router)
		key, _, _ := strings.Cut(problem, " Schema:") // one line for each disagreement, whatever the body
		if problem == "" || seen[key] {
			continue
		}
		seen[key] = true
		problems = append(problems, problem)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d exchanges of %d the HTTP tests had disagree with httpapi/openapi.json:\n%s", len(problems), len(l.logged), strings.Join(problems, "\n"))
	}
	fmt.Printf("contract: %d exchanges with the nodes agree with httpapi/openapi.json\n", len(l.logged))
	return nil
}

// validate checks one exchange; it returns what disagrees ("" when
// nothing does).
func (e *exchange) validate(router routers.Router) string {
	ctx := context.Background()
	req, err := http.NewRequest(e.method, "http://stockd"+e.uri, bytes.NewReader(e.reqBody))
	if err != nil {
		return fmt.Sprintf("%s %s: %v", e.method, e.uri, err)
	}
	req.Header = e.reqHeader.Clone()
	if len(e.reqBody) > 0 && req.Header.Get("Content-Type") == "" {
		// The nodes read every body as JSON whatever its Content-Type
		// (curl -d sends none of use); the document names JSON.
		req.Header.Set("Content-Type", "application/json")
	}
	route, params, err := router.FindRoute(req)
	switch {
	case errors.Is(err, routers.ErrMethodNotAllowed) && e.status == http.StatusMethodNotAllowed,
		errors.Is(err, routers.ErrPathNotFound) && e.status == http.StatusNotFound:
		return "" // the contract's answer to a route or method it does not have
	case err != nil:
		return fmt.Sprintf("%s %s answered %d: not in the document: %v", e.method, req.URL.Path, e.status, err)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: false}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	where := fmt.Sprintf("%s %s answered %d", e.method, route.Path, e.status)
	if e.status/100 == 2 {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			return where + ": the request disagrees: " + short(err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: e.status, Header: e.respHeader, Options: opts}
	out.SetBodyBytes(e.respBody)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return where + ": the answer disagrees: " + short(err) + fmt.Sprintf(" (body %.200s)", e.respBody)
	}
	return ""
}

func short(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

func TestMain(m *testing.M) {
	nodetest.Record = contractLog.record // the harness's calls too
	code := m.Run()
	if code == 0 {
		if err := contractLog.check(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: the contract:", err)
			code = 1
		}
	}
	os.Exit(code)
}
