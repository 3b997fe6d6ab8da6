package sink

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"stockd.dev/stockd/client"
)

// Reconcile's exit codes: 0 the two ledgers agree.
const (
	ReconcileDiffer = 1 // orders differ (named on stdout)
	ReconcileBehind = 2 // the sink did not reach the feed's head in time
)

// ErrBehind: the sink did not reach the head in time (exit 2).
var ErrBehind = errors.New("the sink did not reach the feed's head in time")

// ErrDiffer: the table and stockd's orders differ (exit 1).
var ErrDiffer = errors.New("the table and stockd's orders differ")

// reconciler is one run of `stockd reconcile`.
type reconciler struct {
	o        *options
	sku      string
	deadline time.Time
	out      io.Writer
	log      *slog.Logger
	client   *client.Client
	store    *store

	diffs      []string // the first namedMax, each naming its order
	differ     int
	compared   int
	turnedDown int // rows of takes the ledger turned down
}

// namedMax is how many differences reconcile names.
const namedMax = 100

// Reconcile runs `stockd reconcile`: nil when the table agrees with
// stockd, else an error wrapping ErrDiffer or ErrBehind (or another).
func Reconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	targets := o.register(fs)
	r := &reconciler{o: o, out: stdout}
	fs.StringVar(&o.consumer, "consumer", "", "the sink's consumer (default: the only one in the cursor table)")
	fs.StringVar(&r.sku, "sku", "", "reconcile this sale only")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the sink to reach the feed's head")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd reconcile -db DSN [-target URL,...] [flags]\n\nCompares stockd's orders with the sink's table. Exit 0: they agree; 1: they differ (the orders named); 2: the sink did not catch up in time.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// The sink's own variables say where its table is.
	shared := map[string]bool{"target": true, "db": true, "table": true, "consumer": true, "ca": true, "cert": true, "key": true}
	if _, err := applyEnv(fs, shared); err != nil {
		return err
	}
	probe := *o
	if probe.consumer == "" {
		probe.consumer = "-"
	}
	if err := probe.check(*targets); err != nil {
		return err
	}
	o.targets = probe.targets
	r.deadline = time.Now().Add(*wait)
	r.log = slog.New(slog.NewTextHandler(stderr, nil)).With("component", "reconcile")
	cl, err := o.client(0)
	if err != nil {
		return err
	}
	defer cl.Close()
	r.client = cl
	db, d, err := openDB(o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	r.store = &store{db: db, t: tables{d: d, orders: o.table, cursor: o.table + "_cursor"}}
	for _, tb := range []struct {
		name string
		cols []column
	}{{r.store.t.orders, orderColumns}, {r.store.t.cursor, cursorColumns}} {
		if err := r.store.t.check(ctx, db, tb.name, tb.cols); err != nil {
			return err
		}
	}
	if r.store.consumer, err = r.pickConsumer(ctx); err != nil {
		return err
	}
	return r.run(ctx)
}

func (r *reconciler) pickConsumer(ctx context.Context) (string, error) {
	if r.o.consumer != "" {
		return r.o.consumer, nil
	}
	rows, err := r.store.db.QueryContext(ctx, "SELECT consumer FROM "+r.store.t.d.quote(r.store.t.cursor))
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return "", err
		}
		names = append(names, n)
	}
	if len(names) != 1 {
		return "", fmt.Errorf("the cursor table %s holds %d consumers (%s): name one with -consumer", r.store.t.cursor, len(names), strings.Join(names, ", "))
	}
	return names[0], rows.Err()
}

func (r *reconciler) run(ctx context.Context) error {
	head, err := r.client.FeedHead(ctx)
	if err != nil {
		return fmt.Errorf("read the feed's head: %w", err)
	}
	if _, err := r.waitFor(ctx, head); err != nil {
		return err
	}
	skus, archived, err := r.sales(ctx)
	if err != nil {
		return err
	}
	for _, sku := range skus {
		if err := r.sale(ctx, sku); err != nil {
			return fmt.Errorf("sale %s: %w", sku, err)
		}
	}
	for _, sku := range archived {
		fmt.Fprintf(r.out, "sale %s is archived: its orders left stockd's ledger, its rows are not compared\n", sku)
	}
	for _, d := range r.diffs {
		fmt.Fprintln(r.out, d)
	}
	if r.differ > len(r.diffs) {
		fmt.Fprintf(r.out, "... and %d more\n", r.differ-len(r.diffs))
	}
	if r.differ > 0 {
		return fmt.Errorf("%w: %d differences among %d orders in %d sales (through feed cursor %s)", ErrDiffer, r.differ, r.compared, len(skus), head)
	}
	fmt.Fprintf(r.out, "reconcile: %d orders in %d sales agree (through feed cursor %s); %d rows are takes the ledger turned down\n",
		r.compared, len(skus), head, r.turnedDown)
	return nil
}

// waitFor waits until the database's cursor reaches cursor c, and returns
// the database's.
func (r *reconciler) waitFor(ctx context.Context, c string) (string, error) {
	want, err := cursorSeq(c)
	if err != nil {
		return "", err
	}
	for {
		have, err := r.store.cursor(ctx)
		if err != nil {
			return "", err
		}
		if mustSeq(have) >= want {
			return have, nil
		}
		if time.Now().After(r.deadline) {
			return have, fmt.Errorf("%w: the table is at feed cursor %s, the feed at %s", ErrBehind, have, c)
		}
		select {
		case <-ctx.Done():
			return have, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sales lists the sales to compare: stockd's, and any the table names
// that stockd does not know. Archived sales are listed apart.
func (r *reconciler) sales(ctx context.Context) (skus, archived []string, err error) {
	if r.sku != "" {
		return []string{r.sku}, nil, nil
	}
	list, err := r.client.Sales(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list the sales: %w", err)
	}
	seen := map[string]bool{}
	for _, s := range list {
		seen[s.SKU] = true
		if s.Archived {
			archived = append(archived, s.SKU)
		} else {
			skus = append(skus, s.SKU)
		}
	}
	rows, err := r.store.db.QueryContext(ctx, "SELECT DISTINCT sku FROM "+r.store.t.d.quote(r.store.t.orders))
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, nil, err
		}
		if !seen[s] {
			skus = append(skus, s)
		}
	}
	slices.Sort(skus)
	return skus, archived, rows.Err()
}

// stockOrder is an order as stockd's orders stream shows it.
type stockOrder struct {
	OrderID       string `json:"order_id"`
	SKU           string `json:"sku"`
	User          string `json:"user"`
	Qty           int64  `json:"qty"`
	State         string `json:"state"`
	RequestID     string `json:"request_id"`
	ReleaseReason string `json:"release_reason"`
}

// sale compares one sale: stockd's orders (spooled to a file, so memory
// does not grow with them) against the table's rows, both in order id
// order.
func (r *reconciler) sale(ctx context.Context, sku string) error {
	before, _ := r.client.SKU(ctx, sku)
	spool, err := os.CreateTemp("", "stockd-reconcile-*.ndjson")
	if err != nil {
		return err
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	w := bufio.NewWriter(spool)
	end, err := r.client.SaleOrders(ctx, sku, func(line []byte) error {
		_, err := w.Write(append(line, '\n'))
		return err
	}, func() {
		w.Reset(spool)
		_, _ = spool.Seek(0, io.SeekStart)
		_ = spool.Truncate(0)
	})
	unknown := errors.Is(err, client.ErrUnknownSKU) || errors.Is(err, client.ErrNotFound) // not a sale of stockd's: every row is foreign
	switch {
	case unknown:
		end = client.OrdersEnd{FeedCursor: "0"}
	case err != nil:
		return fmt.Errorf("read stockd's orders: %w", err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, end.FeedCursor); err != nil {
		return err
	}
	snap := mustSeq(end.FeedCursor)
	tx, err := r.store.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var dbCursor string
	if err := tx.QueryRowContext(ctx, "SELECT feed_cursor FROM "+r.store.t.d.quote(r.store.t.cursor)+" WHERE consumer = "+
		r.store.t.d.placeholder(1), r.store.consumer).Scan(&dbCursor); err != nil {
		return fmt.Errorf("read the cursor: %w", err)
	}
	order := "order_id"
	if r.store.t.d == postgres {
		order = `order_id COLLATE "C"`
	}
	rows, err := tx.QueryContext(ctx, "SELECT order_id, sku, buyer, qty, state, release_reason, request_id, feed_cursor FROM "+
		r.store.t.d.quote(r.store.t.orders)+" WHERE sku = "+r.store.t.d.placeholder(1)+" ORDER BY "+order, sku)
	if err != nil {
		return err
	}
	defer rows.Close()
	m := merge{r: r, snap: snap, dbSeq: mustSeq(dbCursor), stock: bufio.NewScanner(spool)}
	if unknown {
		m.snap = m.dbSeq // no row of it is newer than stockd's answer
	}
	m.stock.Buffer(make([]byte, 0, 4096), 1<<20)
	if err := m.run(rows); err != nil {
		return err
	}
	after, _ := r.client.SKU(ctx, sku)
	if !m.skipped && before == after && before.SKU != "" && (m.held != before.Held || m.sold != before.Sold) {
		r.note(fmt.Sprintf("sale %s: the table holds %d held and %d sold units, stockd's ledger %d and %d", sku, m.held, m.sold, before.Held, before.Sold))
	}
	return nil
}

func (r *reconciler) note(d string) {
	r.differ++
	if len(r.diffs) < namedMax {
		r.diffs = append(r.diffs, d)
	}
}

// merge walks stockd's orders and the table's rows of one sale together.
// snap is the feed sequence stockd's orders reflect, dbSeq the table's:
// a row written by a later event than snap is newer than stockd's answer
// and is not compared; a row beyond the table's own cursor was not
// written by the sink.
type merge struct {
	r            *reconciler
	snap, dbSeq  uint64
	stock        *bufio.Scanner
	held, sold   int64
	skipped      bool
	lastStockKey string
}

type tableRow struct {
	stockOrder
	cursor string
}

func (m *merge) next() (*stockOrder, error) {
	if !m.stock.Scan() {
		return nil, m.stock.Err()
	}
	var o stockOrder
	if err := json.Unmarshal(m.stock.Bytes(), &o); err != nil {
		return nil, fmt.Errorf("stockd's order %q: %w", m.stock.Bytes(), err)
	}
	if o.OrderID < m.lastStockKey {
		return nil, fmt.Errorf("stockd's orders are not in order id order (%s after %s)", o.OrderID, m.lastStockKey)
	}
	m.lastStockKey = o.OrderID
	return &o, nil
}

func (m *merge) run(rows *sql.Rows) error {
	o, err := m.next()
	if err != nil {
		return err
	}
	for rows.Next() {
		var t tableRow
		if err := rows.Scan(&t.OrderID, &t.SKU, &t.User, &t.Qty, &t.State, &t.ReleaseReason, &t.RequestID, &t.cursor); err != nil {
			return err
		}
		for o != nil && o.OrderID < t.OrderID {
			m.missing(o)
			if o, err = m.next(); err != nil {
				return err
			}
		}
		if o != nil && o.OrderID == t.OrderID {
			m.compare(o, &t)
			if o, err = m.next(); err != nil {
				return err
			}
		} else {
			m.extra(&t)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for ; o != nil; o, err = m.next() {
		m.missing(o)
	}
	return err
}

func (m *merge) missing(o *stockOrder) {
	m.r.compared++
	m.r.note(fmt.Sprintf("order %s: in stockd (%s, %s, qty %d), missing from the table", o.OrderID, o.SKU, o.State, o.Qty))
}

// rowSeq is a row's feed sequence, or ok false when its cursor is not one
// the sink wrote.
func (m *merge) rowSeq(t *tableRow) (uint64, bool) {
	s, err := cursorSeq(t.cursor)
	return s, err == nil && s > 0 && s <= m.dbSeq
}

func (m *merge) extra(t *tableRow) {
	s, ok := m.rowSeq(t)
	switch {
	case ok && s > m.snap:
		m.skipped = true // an order newer than stockd's answer
		return
	case ok && t.State == "released" && strings.HasPrefix(t.ReleaseReason, "turned_down_"):
		// A take the ledger turned down: its node named the order (an
		// answer with wait=none may have promised it), the ledger never
		// held it. The feed says so; stockd's orders do not list it.
		m.r.turnedDown++
		return
	}
	m.r.compared++
	m.r.note(fmt.Sprintf("order %s: in the table (%s, %s, qty %d), not in stockd", t.OrderID, t.SKU, t.State, t.Qty))
}

func (m *merge) compare(o *stockOrder, t *tableRow) {
	m.r.compared++
	s, ok := m.rowSeq(t)
	switch {
	case !ok:
		m.r.note(fmt.Sprintf("order %s: the table's row has feed cursor %q, which the sink never wrote", t.OrderID, t.cursor))
		return
	case s > m.snap:
		m.skipped = true // changed after stockd's answer
		return
	}
	switch t.State {
	case "held":
		m.held += t.Qty
	case "sold":
		m.sold += t.Qty
	}
	var d []string
	for _, f := range []struct {
		column, stockd, table string
	}{
		{"sku", o.SKU, t.SKU}, {"buyer", o.User, t.User}, {"qty", strconv.FormatInt(o.Qty, 10), strconv.FormatInt(t.Qty, 10)},
		{"state", o.State, t.State}, {"release_reason", o.ReleaseReason, t.ReleaseReason}, {"request_id", o.RequestID, t.RequestID},
	} {
		if f.stockd != f.table {
			d = append(d, fmt.Sprintf("%s %s/%s", f.column, f.stockd, f.table))
		}
	}
	if len(d) > 0 {
		m.r.note(fmt.Sprintf("order %s: stockd/table differ: %s", o.OrderID, strings.Join(d, ", ")))
	}
}
