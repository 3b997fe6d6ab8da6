package deductwire

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
)

// The event loop's reading of one plain deduct: fasthttp's header parser,
// the route from the decoded path, and Reader.Read (the query, the
// credentials' header, the body's scan). The baseline beside it is the
// header parse alone, which fasthttp's own door pays too.
func BenchmarkReader_HeadRouteAndRead(b *testing.B) {
	raw := []byte("POST /v1/skus/gone/deduct HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nContent-Length: 43\r\n\r\n")
	body := []byte(`{"user":"u1","qty":1,"request_id":"r-1234"}`)
	var req fasthttp.Request
	var hr bytes.Reader
	br := bufio.NewReaderSize(nil, 4096)
	var r Reader
	var dst engine.DeductRequest
	b.ReportAllocs()
	for b.Loop() {
		req.Reset()
		hr.Reset(raw)
		br.Reset(&hr)
		if err := req.Header.Read(br); err != nil {
			b.Fatal(err)
		}
		sku, ok := DeductSKU(req.URI().Path())
		req.SetBodyRaw(body)
		if st, _ := r.Read(&req, sku, &dst); st != 0 || !ok {
			b.Fatal(st)
		}
	}
}

func BenchmarkReader_BaselineHeadOnly(b *testing.B) {
	raw := []byte("POST /v1/skus/gone/deduct HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nContent-Length: 43\r\n\r\n")
	var req fasthttp.Request
	var hr bytes.Reader
	br := bufio.NewReaderSize(nil, 4096)
	b.ReportAllocs()
	for b.Loop() {
		req.Reset()
		hr.Reset(raw)
		br.Reset(&hr)
		if err := req.Header.Read(br); err != nil {
			b.Fatal(err)
		}
	}
}
