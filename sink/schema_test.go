package sink_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/internal/dbtest"
	"stockd.dev/stockd/sink"
)

func TestSink_TableShape_PostgreSQL(t *testing.T) { tableShape(t, dbtest.Postgres(t)) }

func TestSink_TableShape_MariaDB(t *testing.T) { tableShape(t, dbtest.MariaDB(t)) }

// sinkErr runs the sink once against a feed that has no events and
// returns its error.
func sinkErr(t *testing.T, feed http.Handler, dsn string, extra ...string) (string, error) {
	t.Helper()
	srv := httptest.NewServer(feed)
	defer srv.Close()
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"-target", srv.URL, "-db", dsn, "-consumer", "shop", "-wait", "0s", "-exit-when-idle", "-progress", "0"}, extra...)
	err := sink.Main(ctx, args, &out, &errs)
	return errs.String(), err
}

// emptyFeed is a node whose feed is empty and which knows the consumer.
var emptyFeed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/consumers":
		w.Write([]byte(`{"consumers":[{"name":"shop","cursor":"0"}]}`))
	case "/v1/events":
		w.Write([]byte(`{"events":[],"next":"0","head":"0"}`))
	default:
		w.WriteHeader(404)
		w.Write([]byte(`{"error":"not_found"}`))
	}
})

// tableShape: a table missing a column, or with a column of another
// type, or keyed on another column, is refused with the column named; the
// shop's own extra columns are left alone.
func tableShape(t *testing.T, srv *dbtest.Server) {
	db := srv.DB()
	text, stamp := "text", "timestamptz"
	if srv.Kind == "mariadb" {
		text, stamp = "VARCHAR(255)", "DATETIME(6)"
	}
	cols := func(qty string) string {
		return "(order_id " + text + " PRIMARY KEY, sku " + text + ", buyer " + text + ", qty " + qty + ", state " + text + ", release_reason " + text +
			", request_id " + text + ", created_at " + stamp + ", updated_at " + stamp + ", feed_cursor " + text
	}
	for _, c := range []struct{ name, create, want string }{
		{"a_missing", "(order_id " + text + " PRIMARY KEY, sku " + text + ")", "has no column buyer"},
		{"a_type", cols(text) + ")", "column qty is"},
		{"a_key", strings.Replace(cols("bigint"), " PRIMARY KEY", "", 1) + ", PRIMARY KEY (sku))", "the primary key is (sku)"},
	} {
		if _, err := db.Exec("CREATE TABLE " + c.name + " " + c.create); err != nil {
			t.Fatal(err)
		}
		_, err := sinkErr(t, emptyFeed, srv.DSN, "-table", c.name)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-table %s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	if _, err := db.Exec("CREATE TABLE shop_orders " + cols("bigint") + ", note " + text + ")"); err != nil {
		t.Fatal(err)
	}
	if log, err := sinkErr(t, emptyFeed, srv.DSN, "-table", "shop_orders"); err != nil {
		t.Fatalf("a table with the shop's own column: %v\n%s", err, log)
	}
	if _, err := sinkErr(t, emptyFeed, srv.DSN, "-table", "Shop-Orders"); err == nil || !strings.Contains(err.Error(), "-table") {
		t.Errorf("a table name that needs quoting: %v", err)
	}
}

// TestSink_ACursorPastRetentionStopsIt: a database cursor the feed has
// pruned (410) stops the sink with the reason; it never skips ahead.
func TestSink_ACursorPastRetentionStopsIt(t *testing.T) {
	srv := dbtest.Postgres(t)
	gone := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/consumers":
			w.Write([]byte(`{"consumers":[{"name":"shop","cursor":"0"}]}`))
		default:
			w.WriteHeader(http.StatusGone)
			w.Write([]byte(`{"error":"cursor_expired","detail":"events through 90-80 were pruned"}`))
		}
	})
	if _, err := srv.DB().Exec("CREATE TABLE stockd_orders_cursor (consumer text PRIMARY KEY, feed_cursor text NOT NULL, updated_at timestamptz NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.DB().Exec("INSERT INTO stockd_orders_cursor VALUES ('shop', '12-7', now())"); err != nil {
		t.Fatal(err)
	}
	_, err := sinkErr(t, gone, srv.DSN)
	if err == nil || !strings.Contains(err.Error(), "410") || !strings.Contains(err.Error(), "after 12-7") {
		t.Fatalf("a pruned cursor: %v", err)
	}
	var cur string
	if err := srv.DB().QueryRow("SELECT feed_cursor FROM stockd_orders_cursor").Scan(&cur); err != nil || cur != "12-7" {
		t.Fatalf("the cursor moved to %s (%v)", cur, err)
	}
	// A database that refuses the login is said so, not retried forever.
	bad := strings.Replace(srv.DSN, "postgres@", "nobody@", 1)
	if _, err := sinkErr(t, emptyFeed, bad); err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("a refused login: %v", err)
	}
}
