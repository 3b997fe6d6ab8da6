package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const pgSchema = `
CREATE TABLE IF NOT EXISTS bench_stock (sku text PRIMARY KEY, n bigint NOT NULL, sold bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS bench_orders (request_id text PRIMARY KEY, sku text NOT NULL, qty bigint NOT NULL);`

// pgOptimisticDeduct is one autocommit statement: decrement only while
// stock covers the qty and the request id is new, and record the order. A
// concurrent repeat of the request id fails on the primary key and the
// whole statement rolls back.
const pgOptimisticDeduct = `
WITH upd AS (
  UPDATE bench_stock SET n = n - $3, sold = sold + $3
  WHERE sku = $2 AND n >= $3 AND NOT EXISTS (SELECT 1 FROM bench_orders WHERE request_id = $1)
  RETURNING 1)
INSERT INTO bench_orders (request_id, sku, qty) SELECT $1, $2, $3 FROM upd`

type pgStrategy struct {
	noHolds
	pessimistic bool
	pool        *pgxpool.Pool
	sc          *Scenario
	durability  string
}

func newPostgres(ctx context.Context, dsn string, conns int, pessimistic bool) (*pgStrategy, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres dsn: %w", err)
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	var syncCommit, fsync string
	_ = pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&syncCommit)
	_ = pool.QueryRow(ctx, "SHOW fsync").Scan(&fsync)
	return &pgStrategy{pessimistic: pessimistic, pool: pool,
		durability: fmt.Sprintf("WAL fsync=%s, synchronous_commit=%s", fsync, syncCommit)}, nil
}

func (p *pgStrategy) Name() string {
	if p.pessimistic {
		return "pg-pessimistic"
	}
	return "pg-optimistic"
}
func (p *pgStrategy) Durability() string          { return p.durability }
func (p *pgStrategy) Supports(s *Scenario) string { return supportsNoHolds(s) }
func (p *pgStrategy) Close() error                { p.pool.Close(); return nil }

func (p *pgStrategy) Setup(ctx context.Context, s *Scenario) error {
	p.sc = s
	if _, err := p.pool.Exec(ctx, pgSchema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	for k, sku := range s.SKUs {
		_, err := p.pool.Exec(ctx, `INSERT INTO bench_stock (sku, n, sold) VALUES ($1, $2, 0)
			ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n, sold = 0`, sku, s.Units[k])
		if err != nil {
			return fmt.Errorf("stock %s: %w", sku, err)
		}
		if _, err := p.pool.Exec(ctx, `DELETE FROM bench_orders WHERE sku = $1`, sku); err != nil {
			return err
		}
	}
	return nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func (p *pgStrategy) Deduct(ctx context.Context, _ int, r *Request) Outcome {
	sku := p.sc.SKUs[r.SKU]
	if !p.pessimistic {
		tag, err := p.pool.Exec(ctx, pgOptimisticDeduct, r.RequestID, sku, r.Qty)
		switch {
		case isUniqueViolation(err):
			return Outcome{Win: true, OrderID: r.RequestID}
		case err != nil:
			return Outcome{Err: err}
		case tag.RowsAffected() == 1:
			return Outcome{Win: true, OrderID: r.RequestID}
		}
		// No row: sold out, or a repeat of an earlier win.
		var exists bool
		if err := p.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bench_orders WHERE request_id = $1)`, r.RequestID).Scan(&exists); err != nil {
			return Outcome{Err: err}
		}
		if exists {
			return Outcome{Win: true, OrderID: r.RequestID}
		}
		return Outcome{Reason: "sold_out"}
	}
	out, err := p.deductLocked(ctx, sku, r)
	if err != nil {
		return Outcome{Err: err}
	}
	return out
}

// deductLocked is the pessimistic version: lock the row, check, write.
func (p *pgStrategy) deductLocked(ctx context.Context, sku string, r *Request) (Outcome, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Outcome{}, err
	}
	defer tx.Rollback(ctx)
	var n int64
	if err := tx.QueryRow(ctx, `SELECT n FROM bench_stock WHERE sku = $1 FOR UPDATE`, sku).Scan(&n); err != nil {
		return Outcome{}, err
	}
	if n < r.Qty {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bench_orders WHERE request_id = $1)`, r.RequestID).Scan(&exists); err != nil {
			return Outcome{}, err
		}
		if exists {
			return Outcome{Win: true, OrderID: r.RequestID}, nil // a repeat of a win
		}
		return Outcome{Reason: "sold_out"}, nil
	}
	tag, err := tx.Exec(ctx, `INSERT INTO bench_orders (request_id, sku, qty) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, r.RequestID, sku, r.Qty)
	if err != nil {
		return Outcome{}, err
	}
	if tag.RowsAffected() == 0 {
		return Outcome{Win: true, OrderID: r.RequestID}, nil // a repeat of a win
	}
	if _, err := tx.Exec(ctx, `UPDATE bench_stock SET n = n - $2, sold = sold + $2 WHERE sku = $1`, sku, r.Qty); err != nil {
		return Outcome{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Outcome{}, err
	}
	return Outcome{Win: true, OrderID: r.RequestID}, nil
}

func (p *pgStrategy) Remaining(ctx context.Context) (int64, error) {
	var n int64
	err := p.pool.QueryRow(ctx, `SELECT COALESCE(SUM(n), 0) FROM bench_stock WHERE sku = ANY($1)`, p.sc.SKUs).Scan(&n)
	return n, err
}

func (p *pgStrategy) Final(ctx context.Context) (Final, error) {
	f := Final{Valid: true}
	for k, sku := range p.sc.SKUs {
		var n, sold, ordered int64
		if err := p.pool.QueryRow(ctx, `SELECT n, sold FROM bench_stock WHERE sku = $1`, sku).Scan(&n, &sold); err != nil {
			return f, err
		}
		if err := p.pool.QueryRow(ctx, `SELECT COALESCE(SUM(qty), 0) FROM bench_orders WHERE sku = $1`, sku).Scan(&ordered); err != nil {
			return f, err
		}
		f.Remaining += n
		f.Sold += sold
		if n < 0 || n+sold != p.sc.Units[k] || ordered != sold {
			f.Valid = false
			f.Detail += fmt.Sprintf("%s: n %d sold %d ordered %d of %d; ", sku, n, sold, ordered, p.sc.Units[k])
		}
	}
	return f, nil
}
