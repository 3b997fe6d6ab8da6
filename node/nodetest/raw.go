package nodetest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// RawAnswer is one answer to a raw request, as a client reads it (its
// Date header dropped, which differs from one second to the next).
type RawAnswer struct {
	Status int
	Header http.Header
	Body   string
}

// RawExchange sends raw, exactly as written, in pieces of at most split
// bytes (0: at once) on a new connection to addr, reads want answers
// (past any 100 Continue) with net/http's parser, and reports whether the
// server then closed the connection. For what a typed client cannot send:
// repeated headers, bodies that are not JSON, pipelined requests.
func RawExchange(t testing.TB, addr, raw string, split, want int) ([]RawAnswer, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for rest := raw; len(rest) > 0; {
		n := len(rest)
		if split > 0 {
			n = min(n, split)
		}
		if _, err := io.WriteString(c, rest[:n]); err != nil {
			t.Fatalf("send: %v", err)
		}
		rest = rest[n:]
	}
	br := bufio.NewReader(c)
	var out []RawAnswer
	for range want {
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode == http.StatusContinue {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("read answer %d of %d to %q: %v", len(out)+1, want, raw, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		resp.Header.Del("Date")
		out = append(out, RawAnswer{resp.StatusCode, resp.Header, string(b)})
	}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)) // a server that closes does so right after its answer
	_, err = br.ReadByte()
	return out, err == io.EOF
}
