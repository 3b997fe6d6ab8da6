package feed_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"stockd.dev/stockd/feed"
)

// fakeFeed is a node's order feed as the consumer sees it: events 1 to n
// (cursor "<seq>-<seq>"), the consumers' cursors, and a floor below which
// cursors have expired.
type fakeFeed struct {
	mu      sync.Mutex
	n       int
	floor   int
	cursors map[string]string
	acks    []string
	token   string // the admin token acknowledgements need
}

func (f *fakeFeed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/consumers":
		var list []map[string]string
		for name, c := range f.cursors {
			list = append(list, map[string]string{"name": name, "cursor": c})
		}
		json.NewEncoder(w).Encode(map[string]any{"consumers": list})
	case r.Method == http.MethodGet && r.URL.Path == "/v1/events":
		after := 0
		if a := r.URL.Query().Get("after"); a != "0" {
			seq, _, _ := strings.Cut(a, "-")
			after, _ = strconv.Atoi(seq)
		}
		if after < f.floor {
			w.WriteHeader(http.StatusGone)
			fmt.Fprint(w, `{"error":"cursor_expired","detail":"pruned"}`)
			return
		}
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		var events []map[string]any
		next := r.URL.Query().Get("after")
		for seq := after + 1; seq <= f.n && len(events) < limit; seq++ {
			next = fmt.Sprintf("%d-%d", seq, seq)
			events = append(events, map[string]any{"cursor": next, "type": "order_created", "order_id": fmt.Sprintf("o%d", seq)})
		}
		json.NewEncoder(w).Encode(map[string]any{"events": events, "next": next, "head": fmt.Sprintf("%d-%d", f.n, f.n)})
	case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/consumers/"):
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"unauthorized","detail":"admin token"}`)
			return
		}
		var body struct{ Cursor string }
		json.NewDecoder(r.Body).Decode(&body)
		name := strings.TrimPrefix(r.URL.Path, "/v1/consumers/")
		f.cursors[name] = body.Cursor
		f.acks = append(f.acks, body.Cursor)
		fmt.Fprint(w, `{}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":"not_found","detail":"no such route"}`)
	}
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errs bytes.Buffer
	err := feed.Main(context.Background(), args, &out, &errs)
	return out.String(), err
}

// TestFeed_PrintsEachEventOnceAndAcknowledgesEachPage: a first run prints
// every event as a JSON line and acknowledges each page; a second run
// starts after the acknowledged cursor and prints nothing new.
func TestFeed_PrintsEachEventOnceAndAcknowledgesEachPage(t *testing.T) {
	f := &fakeFeed{n: 7, cursors: map[string]string{}, token: "adm"}
	srv := httptest.NewServer(f)
	defer srv.Close()
	out, err := run(t, "-target", srv.URL, "-consumer", "svc", "-limit", "3", "-wait", "0s", "-exit-when-idle", "-admin-token", "adm")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 {
		t.Fatalf("printed %d lines, want 7:\n%s", len(lines), out)
	}
	for i, line := range lines {
		var e map[string]string
		if err := json.Unmarshal([]byte(line), &e); err != nil || e["order_id"] != fmt.Sprintf("o%d", i+1) {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
	}
	if got := strings.Join(f.acks, ","); got != "3-3,6-6,7-7" {
		t.Fatalf("acknowledged %s, want one ack a page", got)
	}
	f.n = 9
	out, err = run(t, "-target", srv.URL, "-consumer", "svc", "-wait", "0s", "-exit-when-idle", "-admin-token", "adm")
	if err != nil || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"o8"`) {
		t.Fatalf("second run: %v\n%s", err, out)
	}
}

// TestFeed_MovesPastADeadNodeAndStopsAtMaxEvents: the first target does
// not answer; the consumer reads from the next and stops at -max-events.
func TestFeed_MovesPastADeadNodeAndStopsAtMaxEvents(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	f := &fakeFeed{n: 50, cursors: map[string]string{}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	out, err := run(t, "-target", deadURL+","+srv.URL, "-consumer", "svc", "-limit", "4", "-wait", "0s", "-max-events", "6", "-ack=false")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 8 { // two pages of four
		t.Fatalf("printed %d events, want 8 (stops after the page that reaches 6):\n%s", n, out)
	}
	if len(f.acks) != 0 {
		t.Fatalf("-ack=false acknowledged %v", f.acks)
	}
}

// TestFeed_AnExpiredCursorSaysHowToStartAgain: a consumer whose cursor
// was pruned is told to reconcile and start with -from 0.
func TestFeed_AnExpiredCursorSaysHowToStartAgain(t *testing.T) {
	f := &fakeFeed{n: 10, floor: 5, cursors: map[string]string{"svc": "2-2"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	_, err := run(t, "-target", srv.URL, "-consumer", "svc", "-wait", "0s", "-exit-when-idle")
	if err == nil || !strings.Contains(err.Error(), "-from 0") {
		t.Fatalf("an expired cursor: %v", err)
	}
}

func TestFeed_RefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},                                     // no consumer
		{"-consumer", "c", "-limit", "0"},      // limit
		{"-consumer", "c", "-wait", "31s"},     // wait
		{"-consumer", "c", "-target", "ftp:x"}, // not http
		{"-consumer", "c", "-target", " , "},   // no node
	} {
		if _, err := run(t, args...); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("%v: %v, want an error", args, err)
		}
	}
}
