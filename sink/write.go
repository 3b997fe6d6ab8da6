package sink

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fastjson"
)

// event is one event of the order feed as GET /v1/events sends it.
type event struct {
	Cursor    string `json:"cursor"`
	Type      string `json:"type"`
	OrderID   string `json:"order_id"`
	SKU       string `json:"sku"`
	User      string `json:"user"`
	Qty       int64  `json:"qty"`
	State     string `json:"state"`
	RequestID string `json:"request_id"`
	Reason    string `json:"reason"`
	At        string `json:"at"`
}

// row is an order as the sink writes it.
type row struct {
	orderID, sku, buyer    string
	qty                    int64
	state, reason, request string
	createdAt, updatedAt   time.Time
	cursor                 string
}

// cursorSeq is a cursor's feed sequence ("<log index>-<seq>"; "0": 0).
func cursorSeq(c string) (uint64, error) {
	if c == "0" {
		return 0, nil
	}
	_, s, ok := strings.Cut(c, "-")
	seq, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil || seq == 0 {
		return 0, fmt.Errorf("bad cursor %q: want <log index>-<sequence>", c)
	}
	return seq, nil
}

// errGap: the feed skipped a sequence number: an event the table would
// never hold.
var errGap = errors.New("the order feed skipped events")

// fold turns a page of events that follows cursor after into one row an
// order (its latest state; created_at from its first event here), in the
// order each order first appears. It checks that the events follow one
// another with no sequence missing.
func fold(after string, events []event) ([]*row, error) {
	seq, err := cursorSeq(after)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*row, len(events))
	rows := make([]*row, 0, len(events))
	for i := range events {
		e := &events[i]
		s, err := cursorSeq(e.Cursor)
		if err != nil {
			return nil, err
		}
		if seq != 0 && s != seq+1 {
			return nil, fmt.Errorf("%w: after sequence %d came %s", errGap, seq, e.Cursor)
		}
		seq = s
		at, err := time.Parse(time.RFC3339Nano, e.At)
		if err != nil {
			return nil, fmt.Errorf("event %s: at %q: %w", e.Cursor, e.At, err)
		}
		if e.OrderID == "" || e.State == "" {
			return nil, fmt.Errorf("event %s names no order or state", e.Cursor)
		}
		r := byID[e.OrderID]
		if r == nil {
			r = &row{orderID: e.OrderID, createdAt: at}
			byID[e.OrderID] = r
			rows = append(rows, r)
		}
		r.sku, r.buyer, r.qty, r.state, r.reason, r.request = e.SKU, e.User, e.Qty, e.State, e.Reason, e.RequestID
		r.updatedAt, r.cursor = at, e.Cursor
	}
	return rows, nil
}

// errCursorMoved: the database's cursor is not the one this sink wrote
// last (another sink, or a person, moved it): start again from it.
type errCursorMoved struct{ want, have string }

func (e *errCursorMoved) Error() string {
	return fmt.Sprintf("the database's cursor is %s, this sink had written %s (another sink on the same consumer, or moved by hand): resuming from the database's", e.have, e.want)
}

// store is the sink's side of the database.
type store struct {
	db       *sql.DB
	t        tables
	consumer string
	upsert   map[int]string // rows in a statement → its SQL
}

// rowsPerStatement bounds an upsert's rows (10 parameters each; both
// databases take 65,535 parameters).
const rowsPerStatement = 500

// cursor reads the consumer's cursor in the database, creating its row
// at "0" when missing.
func (s *store) cursor(ctx context.Context) (string, error) {
	var c string
	err := s.db.QueryRowContext(ctx, "SELECT feed_cursor FROM "+s.t.d.quote(s.t.cursor)+" WHERE consumer = "+s.t.d.placeholder(1), s.consumer).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		insert := "INSERT INTO " + s.t.d.quote(s.t.cursor) + " (consumer, feed_cursor, updated_at) VALUES (" +
			s.t.d.placeholder(1) + ", '0', " + s.t.d.placeholder(2) + ")"
		if s.t.d == postgres {
			insert += " ON CONFLICT (consumer) DO NOTHING"
		} else {
			insert = strings.Replace(insert, "INSERT", "INSERT IGNORE", 1)
		}
		if _, err := s.db.ExecContext(ctx, insert, s.consumer, time.Now().UTC()); err != nil {
			return "", fmt.Errorf("create the cursor row of %s: %w", s.consumer, err)
		}
		return s.cursor(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("read the cursor of %s: %w", s.consumer, err)
	}
	if _, err := cursorSeq(c); err != nil {
		return "", needsPerson(fmt.Errorf("table %s, consumer %s: %w", s.t.cursor, s.consumer, err))
	}
	return c, nil
}

// write commits rows and the cursor next in one transaction, provided the
// database's cursor is still from (read under a row lock, so two sinks on
// one consumer take turns instead of both writing).
func (s *store) write(ctx context.Context, from, next string, rows []*row) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	q := s.t.d.quote(s.t.cursor)
	var have string
	err = tx.QueryRowContext(ctx, "SELECT feed_cursor FROM "+q+" WHERE consumer = "+s.t.d.placeholder(1)+" FOR UPDATE", s.consumer).Scan(&have)
	if err != nil {
		return fmt.Errorf("lock the cursor of %s: %w", s.consumer, err)
	}
	if have != from {
		return &errCursorMoved{want: from, have: have}
	}
	for len(rows) > 0 {
		n := min(len(rows), rowsPerStatement)
		args := make([]any, 0, n*len(orderColumns))
		for _, r := range rows[:n] {
			args = append(args, r.orderID, r.sku, r.buyer, r.qty, r.state, r.reason, r.request, r.createdAt.UTC(), r.updatedAt.UTC(), r.cursor)
		}
		if _, err := tx.ExecContext(ctx, s.upsertSQL(n), args...); err != nil {
			return fmt.Errorf("write %d orders: %w", n, err)
		}
		rows = rows[n:]
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+" SET feed_cursor = "+s.t.d.placeholder(1)+", updated_at = "+s.t.d.placeholder(2)+
		" WHERE consumer = "+s.t.d.placeholder(3), next, time.Now().UTC(), s.consumer); err != nil {
		return fmt.Errorf("move the cursor: %w", err)
	}
	return tx.Commit()
}

// upsertSQL is the statement that writes n rows: a new order is inserted;
// a known one is updated only by an event newer than its row's.
func (s *store) upsertSQL(n int) string {
	if q, ok := s.upsert[n]; ok {
		return q
	}
	d := s.t.d
	var b strings.Builder
	names := make([]string, len(orderColumns))
	for i, c := range orderColumns {
		names[i] = c.name
	}
	fmt.Fprintf(&b, "INSERT INTO %s (%s) VALUES ", d.quote(s.t.orders), strings.Join(names, ", "))
	p := 1
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j := range orderColumns {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(d.placeholder(p))
			p++
		}
		b.WriteByte(')')
	}
	// created_at and order_id stay; the rest follow the newer event.
	updated := []string{"sku", "buyer", "qty", "state", "release_reason", "request_id", "updated_at", "feed_cursor"}
	if d == postgres {
		tbl := d.quote(s.t.orders)
		b.WriteString(" ON CONFLICT (order_id) DO UPDATE SET ")
		for i, c := range updated {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s = EXCLUDED.%s", c, c)
		}
		fmt.Fprintf(&b, " WHERE %s < %s", d.seqOf(tbl+".feed_cursor"), d.seqOf("EXCLUDED.feed_cursor"))
	} else {
		// MySQL assigns left to right: feed_cursor, which the test reads,
		// goes last.
		newer := d.seqOf("VALUES(feed_cursor)") + " > " + d.seqOf("feed_cursor")
		b.WriteString(" ON DUPLICATE KEY UPDATE ")
		for i, c := range updated {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s = IF(%s, VALUES(%s), %s)", c, newer, c, c)
		}
	}
	if s.upsert == nil {
		s.upsert = map[int]string{}
	}
	s.upsert[n] = b.String()
	return s.upsert[n]
}

// parsePage reads a page of GET /v1/events in one pass: its events and
// the feed's head.
func parsePage(p *fastjson.Parser, body []byte) (events []event, head string, err error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, "", fmt.Errorf("the feed's page: %w", err)
	}
	str := func(o *fastjson.Value, k string) string { return string(o.GetStringBytes(k)) }
	arr := v.GetArray("events")
	events = make([]event, len(arr))
	for i, o := range arr {
		events[i] = event{Cursor: str(o, "cursor"), Type: str(o, "type"), OrderID: str(o, "order_id"), SKU: str(o, "sku"),
			User: str(o, "user"), Qty: o.GetInt64("qty"), State: str(o, "state"), RequestID: str(o, "request_id"),
			Reason: str(o, "reason"), At: str(o, "at")}
	}
	return events, str(v, "head"), nil
}
