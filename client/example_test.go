package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"stockd.dev/stockd/client"
)

// A service buys through the client: one request id per purchase, kept
// for every retry; a definite loss is a sentinel; anything else names the
// request id to retry with. (The server here stands in for a stockd node
// with one unit left.)
func Example() {
	left := 1
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			io.WriteString(w, `{"nodes":[]}`)
			return
		}
		if left == 0 {
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":"sold_out","detail":"no units left"}`)
			return
		}
		left--
		io.WriteString(w, `{"order_id":"n1-1-abc","state":"sold","sku":"phone","qty":1}`)
	}))
	defer node.Close()

	c, err := client.New(client.Config{Endpoints: []string{node.URL}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for _, user := range []string{"alice", "bob"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		o, err := c.Deduct(ctx, client.Deduct{SKU: "phone", User: user, RequestID: "checkout-" + user})
		cancel()
		switch {
		case err == nil:
			fmt.Println(user, "won", o.OrderID, o.State)
		case errors.Is(err, client.ErrSoldOut):
			fmt.Println(user, "lost: sold out")
		default:
			fmt.Println(user, "no definite answer; retry with", o.RequestID)
		}
	}
	// Output:
	// alice won n1-1-abc sold
	// bob lost: sold out
}
