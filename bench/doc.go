// Package bench is stockd's load harness: it runs a flash sale against one
// or more stockd nodes (given, or launched in a temp dir), records every
// request's latency and outcome, and checks the final ledger for
// overselling.
//
// This is the first cut: one scenario (flash: few units, many buyers) and
// one strategy (stockd over HTTP). Each worker goroutine owns one
// connection's worth of requests and its own latency recorder; nothing is
// shared on the request path but an atomic buyer counter.
package bench
