package scenario

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// shop is a shop's front end as docs/waiting-room.md describes it: it
// serves a copy of the buyer's page pointed at its own endpoints, knows
// the buyer from a session cookie, and calls stockd as a service with its
// token and the session's user. The page never talks to stockd.
type shop struct {
	stockd, token string
	page          []byte
	calls         atomic.Int64 // calls the shop relayed to stockd
	pageUser      atomic.Bool  // the page sent a user of its own
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/login":
		http.SetCookie(w, &http.Cookie{Name: "session", Value: r.URL.Query().Get("user"), Path: "/"})
		http.Redirect(w, r, "/shop/q/"+r.URL.Query().Get("sku"), http.StatusFound)
	case strings.HasPrefix(r.URL.Path, "/shop/q/"):
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(s.page)
	case strings.HasPrefix(r.URL.Path, "/shop/api/"):
		c, err := r.Cookie("session")
		if err != nil || c.Value == "" {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		s.relay(w, r, c.Value)
	default:
		http.NotFound(w, r)
	}
}

// relay calls stockd for the signed-in user: the paths are stockd's under
// /v1, the user filled in from the session, never from the page.
func (s *shop) relay(w http.ResponseWriter, r *http.Request, user string) {
	path := strings.TrimPrefix(r.URL.Path, "/shop/api")
	var body io.Reader
	if r.Method == http.MethodPost {
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		if in == nil {
			in = map[string]any{}
		}
		if _, had := in["user"]; had {
			s.pageUser.Store(true)
		}
		in["user"] = user
		b, _ := json.Marshal(in)
		body = strings.NewReader(string(b))
	}
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, s.stockd+"/v1"+path+"?"+r.URL.RawQuery, body)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, `{"error":"unavailable"}`, http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	s.calls.Add(1)
	out, _ := io.ReadAll(resp.Body)
	// A ticket is its holder's: the shop shows another user's as none.
	var t struct{ User string }
	if strings.HasPrefix(path, "/queue/") && json.Unmarshal(out, &t) == nil && t.User != "" && t.User != user {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// TestQueuePage_AShopServesItFromItsOwnEndpoints: a node that requires a
// service token, and a shop that copies the buyer's page with its
// stockd-base set to its own endpoints. Bob signs in at the shop, the
// page joins, waits for the open, is admitted and buys through the
// button; stockd holds bob's order, placed with the shop's token, and the
// page sent no user of its own.
func TestQueuePage_AShopServesItFromItsOwnEndpoints(t *testing.T) {
	browser := newBrowser(t)
	n := nodetest.StartNodeWith(t, t.TempDir(), func(c *node.Config) { c.HTTP.ServiceToken, c.HTTP.AdminToken = "svc", "adm" })
	cl := nodetest.ClientOf(n, 4)
	start := time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	if code, body := nodetest.CallHeader(cl, "PUT", "/v1/skus/gadget", fmt.Sprintf(`{"total":5,"admission":"queue","start_at":%q}`, start), "Authorization", "Bearer adm"); code != 201 {
		t.Fatalf("create the sale: %d %v", code, body)
	}
	if code, _ := nodetest.CallHeader(cl, "GET", "/q/gadget", "", "", ""); code != 200 {
		t.Fatalf("the page: %d", code)
	}
	page := rawPage(t, "http://"+n.HTTPAddr()+"/q/gadget")
	copied := strings.Replace(page, `<meta name="stockd-base" content="">`, `<meta name="stockd-base" content="/shop/api">`, 1)
	if copied == page {
		t.Fatal("the page has no stockd-base meta tag to point at a shop")
	}
	sh := &shop{stockd: "http://" + n.HTTPAddr(), token: "svc", page: []byte(copied)}
	srv := httptest.NewServer(sh)
	t.Cleanup(srv.Close)

	tab := newTab(t, browser, 390, 844, srv.URL+"/login?user=bob&sku=gadget")
	waitState(t, tab, "bob", "admitted", 20*time.Second)
	if err := chromedp.Do(tab, chromedp.Click("#buy")); err != nil {
		t.Fatal(err)
	}
	waitState(t, tab, "bob", "bought", 10*time.Second)
	detail, _ := pageText(tab, "#detail")
	order, ok := strings.CutPrefix(strings.TrimSuffix(detail, "."), "Order ")
	if !ok {
		t.Fatalf("bob's page after the purchase: %q", detail)
	}
	code, o := nodetest.CallHeader(cl, "GET", "/v1/orders/"+order, "", "Authorization", "Bearer svc")
	if code != 200 || o["user"] != "bob" || o["sku"] != "gadget" {
		t.Fatalf("stockd's order %s: %d %v", order, code, o)
	}
	if who, _ := pageText(tab, "#who"); who != "" || sh.pageUser.Load() {
		t.Fatalf("the shop's page names a user of its own: %q, sent one %v", who, sh.pageUser.Load())
	}
	t.Logf("the shop relayed %d calls; bob's order %s", sh.calls.Load(), order)
	nodetest.CheckLedger(t, cl, "gadget")
}

// rawPage reads url's body.
func rawPage(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
