package dbtest

import (
	"database/sql"
	"testing"
)

// AddAuditTrigger adds an insert-only audit table to table (created by
// the sink): a trigger logs every row inserted into it, and the audit
// table has no unique key, so an order inserted twice shows twice.
func (s *Server) AddAuditTrigger(tb testing.TB, db *sql.DB, table string) {
	tb.Helper()
	stmts := []string{
		"CREATE TABLE " + table + "_audit (order_id VARCHAR(255) NOT NULL, inserted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
		"CREATE TRIGGER " + table + "_audit AFTER INSERT ON " + table + " FOR EACH ROW INSERT INTO " + table + "_audit (order_id) VALUES (NEW.order_id)",
	}
	if s.Kind == "postgres" {
		stmts = []string{
			"CREATE TABLE " + table + "_audit (order_id text NOT NULL, inserted_at timestamptz NOT NULL DEFAULT clock_timestamp())",
			"CREATE FUNCTION " + table + "_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " + table +
				"_audit (order_id) VALUES (NEW.order_id); RETURN NEW; END $$",
			"CREATE TRIGGER " + table + "_audit AFTER INSERT ON " + table + " FOR EACH ROW EXECUTE FUNCTION " + table + "_audit()",
		}
	}
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
}

// CheckInsertedOnce fails tb unless the audit table logged every row of
// table exactly once and nothing else; it returns the rows.
func (s *Server) CheckInsertedOnce(tb testing.TB, db *sql.DB, table string) int {
	tb.Helper()
	var rows, audited, distinct int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&rows); err != nil {
		tb.Fatal(err)
	}
	if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM "+table+"_audit").Scan(&audited, &distinct); err != nil {
		tb.Fatal(err)
	}
	if audited != rows || distinct != rows {
		var twice []string
		r, err := db.Query("SELECT order_id FROM " + table + "_audit GROUP BY order_id HAVING COUNT(*) > 1 LIMIT 10")
		if err == nil {
			for r.Next() {
				var id string
				_ = r.Scan(&id)
				twice = append(twice, id)
			}
			r.Close()
		}
		tb.Fatalf("%s: %d rows, the audit logged %d inserts of %d orders; inserted more than once: %v", table, rows, audited, distinct, twice)
	}
	return rows
}
