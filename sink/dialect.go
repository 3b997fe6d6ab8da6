package sink

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// dialect is what differs between PostgreSQL and MySQL/MariaDB: the
// driver, the column types, placeholders and the upsert.
type dialect struct {
	name   string // "postgres" or "mysql"
	driver string
	// types maps each column to its type when the sink creates the table,
	// and accepted lists the information_schema data types it takes for
	// each kind of column in a table it finds.
	text, textKey, bigint, stamp string
	accepted                     map[string][]string
}

var postgres = &dialect{name: "postgres", driver: "pgx",
	text: "text", textKey: "text", bigint: "bigint", stamp: "timestamptz",
	accepted: map[string][]string{
		"text":   {"text", "character varying"},
		"bigint": {"bigint"},
		"stamp":  {"timestamp with time zone"},
	}}

var mysqlDialect = &dialect{name: "mysql", driver: "mysql",
	text: "VARCHAR(255)", textKey: "VARCHAR(255)", bigint: "BIGINT", stamp: "DATETIME(6)",
	accepted: map[string][]string{
		"text":   {"varchar", "text", "mediumtext", "longtext"},
		"bigint": {"bigint"},
		"stamp":  {"datetime"},
	}}

// placeholder is the n-th (from 1) bind parameter.
func (d *dialect) placeholder(n int) string {
	if d == postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// quote quotes an identifier the sink already checked (tableName).
func (d *dialect) quote(id string) string {
	if d == postgres {
		return `"` + id + `"`
	}
	return "`" + id + "`"
}

// seqOf is the SQL that reads the feed sequence (the part after the dash)
// of a cursor column or value, as an integer: what "newer" compares.
func (d *dialect) seqOf(expr string) string {
	if d == postgres {
		return "COALESCE(NULLIF(split_part(" + expr + ", '-', 2), ''), '0')::bigint"
	}
	return "CAST(SUBSTRING_INDEX(" + expr + ", '-', -1) AS UNSIGNED)"
}

// tableNameRE is what -table takes: one lower-case SQL identifier that
// needs no quoting rules of either database to mean one thing.
var tableNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,55}$`)

// openDB opens dsn (postgres:// or postgresql://, else mysql://) with
// the dialect it names. It does not connect.
func openDB(dsn string) (*sql.DB, *dialect, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("-db: %w", err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		db, err := sql.Open(postgres.driver, dsn)
		return db, postgres, err
	case "mysql", "mariadb":
		cfg, err := mysqlConfig(u)
		if err != nil {
			return nil, nil, err
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("-db: %w", err)
		}
		return sql.OpenDB(conn), mysqlDialect, nil
	}
	return nil, nil, fmt.Errorf("-db %q: want a postgres:// or mysql:// URL", redact(dsn))
}

// mysqlConfig reads mysql://user:password@host:port/database?socket=/path
// &tls=true|skip-verify|preferred. Times are UTC both ways; any other
// parameter is refused rather than guessed at.
func mysqlConfig(u *url.URL) (*mysql.Config, error) {
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, errors.New("-db: a mysql:// URL names its database: mysql://user:password@host:3306/shop")
	}
	cfg.Net, cfg.Addr = "tcp", u.Host
	if _, _, err := net.SplitHostPort(u.Host); err != nil && u.Host != "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	for k, v := range u.Query() {
		switch {
		case len(v) != 1:
			return nil, fmt.Errorf("-db: %s is given %d times", k, len(v))
		case k == "socket":
			cfg.Net, cfg.Addr = "unix", v[0]
		case k == "tls":
			cfg.TLSConfig = v[0]
		default:
			return nil, fmt.Errorf("-db: unknown mysql:// parameter %q (known: socket, tls)", k)
		}
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, time.Minute, time.Minute
	return cfg, nil
}

// redact hides a URL's password for logs and errors.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// errNeedsPerson marks an error that waiting does not mend: a table of
// another shape, a cursor the sink cannot read.
var errNeedsPerson = errors.New("needs a person")

// needsPerson wraps err as errNeedsPerson, its message unchanged.
func needsPerson(err error) error { return &personError{err} }

type personError struct{ error }

func (e *personError) Unwrap() []error { return []error{e.error, errNeedsPerson} }

// retryable reports whether a database error may pass by itself (the
// server restarting, a dropped connection, a lock conflict) rather than
// need a person (a refused login, a missing table, a value the column
// cannot hold).
func retryable(err error) bool {
	if errors.Is(err, errNeedsPerson) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code[:2] {
		case "28", "42", "3D", "3F", "22", "23", "0A":
			return false // authorization, schema, data, constraint, unsupported
		}
		return true
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1044, 1045, 1049, 1054, 1064, 1142, 1146, 1264, 1366, 1406, 1292:
			return false // access, unknown database/column/table, syntax, data
		}
		return true
	}
	return true // connections, timeouts: the server may come back
}
