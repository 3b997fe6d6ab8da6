package sink

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestFold_OneRowAnOrderItsLatestStateAndFirstTime(t *testing.T) {
	events := []event{
		{Cursor: "10-4", OrderID: "o1", SKU: "a", User: "u", Qty: 1, State: "held", At: "2026-12-06T10:00:00Z"},
		{Cursor: "11-5", OrderID: "o2", SKU: "a", User: "v", Qty: 2, State: "sold", At: "2026-12-06T10:00:01Z"},
		{Cursor: "12-6", OrderID: "o1", SKU: "a", User: "u", Qty: 1, State: "released", Reason: "expired", At: "2026-12-06T10:00:05Z"},
	}
	rows, err := fold("9-3", events)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].orderID != "o1" || rows[1].orderID != "o2" {
		t.Fatalf("rows %+v", rows)
	}
	o1 := rows[0]
	if o1.state != "released" || o1.reason != "expired" || o1.cursor != "12-6" ||
		!o1.createdAt.Equal(time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)) || !o1.updatedAt.Equal(time.Date(2026, 12, 6, 10, 0, 5, 0, time.UTC)) {
		t.Fatalf("o1 %+v", o1)
	}
}

func TestFold_RefusesAGapInTheFeed(t *testing.T) {
	events := []event{{Cursor: "10-5", OrderID: "o1", State: "held", At: "2026-12-06T10:00:00Z"}}
	if _, err := fold("9-3", events); !errors.Is(err, errGap) {
		t.Fatalf("after 3 came 5: %v, want errGap", err)
	}
	if _, err := fold("0", events); err != nil {
		t.Fatalf("a first page may start anywhere (the caller checks pruning): %v", err)
	}
	for _, bad := range []event{
		{Cursor: "10-4", OrderID: "o1", State: "held", At: "yesterday"},
		{Cursor: "10-4", State: "held", At: "2026-12-06T10:00:00Z"},
		{Cursor: "x", OrderID: "o1", State: "held", At: "2026-12-06T10:00:00Z"},
	} {
		if _, err := fold("9-3", []event{bad}); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestMySQLConfig_OneMeaningPerURL(t *testing.T) {
	u, _ := url.Parse("mysql://shop:s3cret@db.internal/orders?tls=true")
	cfg, err := mysqlConfig(u)
	if err != nil || cfg.Addr != "db.internal:3306" || cfg.User != "shop" || cfg.Passwd != "s3cret" || cfg.DBName != "orders" ||
		cfg.TLSConfig != "true" || !cfg.ParseTime || cfg.Loc != time.UTC {
		t.Fatalf("%+v %v", cfg, err)
	}
	u, _ = url.Parse("mysql://root@localhost/shop?socket=/run/mysqld/mysqld.sock")
	if cfg, err := mysqlConfig(u); err != nil || cfg.Net != "unix" || cfg.Addr != "/run/mysqld/mysqld.sock" {
		t.Fatalf("socket: %+v %v", cfg, err)
	}
	for _, bad := range []string{"mysql://root@localhost/", "mysql://root@localhost/shop?parseTime=false", "mysql://root@h/shop?tls=true&tls=false"} {
		u, _ := url.Parse(bad)
		if _, err := mysqlConfig(u); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, _, err := openDB("sqlite:///tmp/x"); err == nil || !strings.Contains(err.Error(), "postgres:// or mysql://") {
		t.Errorf("another scheme: %v", err)
	}
	if got := redact("postgres://shop:s3cret@h/db"); strings.Contains(got, "s3cret") {
		t.Errorf("redact: %s", got)
	}
}
