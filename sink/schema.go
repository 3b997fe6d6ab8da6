package sink

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
)

// column is one column the sink writes: its name and its kind ("text",
// "bigint", "stamp"; the dialect gives the type).
type column struct{ name, kind string }

// orderColumns are the order table's columns, in the order the sink
// writes them.
var orderColumns = []column{
	{"order_id", "text"}, {"sku", "text"}, {"buyer", "text"}, {"qty", "bigint"},
	{"state", "text"}, {"release_reason", "text"}, {"request_id", "text"},
	{"created_at", "stamp"}, {"updated_at", "stamp"}, {"feed_cursor", "text"},
}

// cursorColumns are the cursor table's.
var cursorColumns = []column{{"consumer", "text"}, {"feed_cursor", "text"}, {"updated_at", "stamp"}}

// tables are the sink's two tables in one database.
type tables struct {
	d              *dialect
	orders, cursor string // unquoted names
}

func (t *tables) typeOf(c column) string {
	switch c.kind {
	case "bigint":
		return t.d.bigint
	case "stamp":
		return t.d.stamp
	}
	return t.d.text
}

func (t *tables) createSQL(name string, cols []column) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (", t.d.quote(name))
	for i, c := range cols {
		typ := t.typeOf(c)
		if i == 0 {
			typ = t.d.textKey + " PRIMARY KEY"
		} else {
			typ += " NOT NULL"
		}
		fmt.Fprintf(&b, "%s %s, ", c.name, typ)
	}
	s := strings.TrimSuffix(b.String(), ", ") + ")"
	if t.d == mysqlDialect {
		// Binary comparison: order ids, users and SKUs that differ only in
		// case or accents are different keys, as they are in stockd.
		s += " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin ENGINE=InnoDB"
	}
	return s
}

// ensure creates the tables when missing and checks those it finds: every
// column the sink writes is there with a type of its kind, and the first
// is the primary key. Other columns are the shop's and are left alone.
func (t *tables) ensure(ctx context.Context, db *sql.DB) error {
	for _, tb := range []struct {
		name string
		cols []column
	}{{t.orders, orderColumns}, {t.cursor, cursorColumns}} {
		if _, err := db.ExecContext(ctx, t.createSQL(tb.name, tb.cols)); err != nil {
			return fmt.Errorf("create table %s: %w", tb.name, err)
		}
		if err := t.check(ctx, db, tb.name, tb.cols); err != nil {
			return err
		}
	}
	return nil
}

// check compares table name's columns with cols.
func (t *tables) check(ctx context.Context, db *sql.DB, name string, cols []column) error {
	schema := "current_schema()"
	if t.d == mysqlDialect {
		schema = "DATABASE()"
	}
	rows, err := db.QueryContext(ctx, "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "+
		schema+" AND table_name = "+t.d.placeholder(1), name)
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", name, err)
	}
	have := map[string]string{}
	for rows.Next() {
		var col, typ string
		if err := rows.Scan(&col, &typ); err != nil {
			rows.Close()
			return err
		}
		have[strings.ToLower(col)] = strings.ToLower(typ)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range cols {
		typ, ok := have[c.name]
		switch {
		case !ok:
			return needsPerson(fmt.Errorf("table %s has no column %s (%s): add it, or name another table with -table", name, c.name, t.typeOf(c)))
		case !slices.Contains(t.d.accepted[c.kind], typ):
			return needsPerson(fmt.Errorf("table %s: column %s is %s, the sink writes %s there (want one of %s)", name, c.name, typ, t.typeOf(c),
				strings.Join(t.d.accepted[c.kind], ", ")))
		}
	}
	key, err := t.primaryKey(ctx, db, name)
	if err != nil {
		return err
	}
	if len(key) != 1 || key[0] != cols[0].name {
		return needsPerson(fmt.Errorf("table %s: the primary key is (%s), the sink needs it to be (%s): one row an %s", name,
			strings.Join(key, ", "), cols[0].name, cols[0].name))
	}
	return nil
}

func (t *tables) primaryKey(ctx context.Context, db *sql.DB, name string) ([]string, error) {
	q := `SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisprimary`
	if t.d == mysqlDialect {
		q = `SELECT column_name FROM information_schema.key_column_usage
			WHERE table_schema = DATABASE() AND table_name = ? AND constraint_name = 'PRIMARY' ORDER BY ordinal_position`
	}
	rows, err := db.QueryContext(ctx, q, name)
	if err != nil {
		return nil, fmt.Errorf("read the primary key of %s: %w", name, err)
	}
	defer rows.Close()
	var key []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		key = append(key, strings.ToLower(c))
	}
	return key, rows.Err()
}
