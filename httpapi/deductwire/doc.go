// Package deductwire is the single deduct's wire format, both ways: how a
// request to POST /v1/skus/{sku}/deduct is routed and read (its path,
// query, credentials, Idempotency-Key header and body) and how the
// engine's result is answered. stockd has two HTTP doors, the fasthttp
// handlers (httpapi) and the event loop (httpapi/eventloop), and both
// read every deduct with Reader and answer it with Answer: a rule about a
// deduct request is written here once and holds at both.
//
// A request reaches Reader as a *fasthttp.Request, whichever door read it
// (the loop parses its heads with fasthttp's own parser), so headers,
// path and query mean the same at both doors down to the byte. Nothing
// here takes a mutex, and reading a deduct of the common shape allocates
// nothing; the values it returns point into the request and the Reader
// until the Reader's next use.
package deductwire
