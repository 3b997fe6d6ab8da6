// Package dbtest starts a real PostgreSQL or MariaDB server for a test,
// from the machine's Debian packages, in a directory of its own on a
// loopback port, and stops it through its own handle: a test can stop it
// hard and start it again. A test skips, saying why, where the server's
// programs are missing.
package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// Server is one database server a test started.
type Server struct {
	Kind string // "postgres" or "mariadb"
	// DSN is the URL stockd sink takes (-db).
	DSN string

	tb   testing.TB
	dir  string
	port int
	bin  string // PostgreSQL's bin directory, or mariadbd

	mu  sync.Mutex
	cmd *exec.Cmd // mariadbd while it runs
}

// asUser runs name as the database's own user when the test runs as root
// (PostgreSQL refuses to run as root), else as the test's user.
func asUser(account, name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", account, "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// ownDir makes a directory under the system's temp dir that account can
// write (the test's own temp dirs are closed to other users).
func ownDir(tb testing.TB, account, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup(account)
		if err != nil {
			tb.Skipf("no %s user to run the database as: %v (install it from Debian's packages)", account, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func run(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}

// Postgres starts a PostgreSQL server with its durable defaults (fsync
// and synchronous_commit on) and stops it when the test ends.
func Postgres(tb testing.TB) *Server {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		tb.Skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does)")
	}
	slices.Sort(bins)
	s := &Server{Kind: "postgres", tb: tb, bin: filepath.Dir(bins[len(bins)-1]), port: freePort(tb)}
	s.dir = ownDir(tb, "postgres", "stockd-pg-")
	run(tb, asUser("postgres", filepath.Join(s.bin, "initdb"), "-D", s.dir+"/data", "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync"))
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	s.Start()
	tb.Cleanup(func() { s.pgCtl("stop", "-m", "immediate") })
	return s
}

func (s *Server) pgCtl(args ...string) ([]byte, error) {
	args = append([]string{"-D", s.dir + "/data"}, args...)
	return asUser("postgres", filepath.Join(s.bin, "pg_ctl"), args...).CombinedOutput()
}

// MariaDB starts a MariaDB server with its durable defaults
// (innodb_flush_log_at_trx_commit=1) and a database "stockd", and stops
// it when the test ends.
func MariaDB(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("mariadbd")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/mariadbd"); err != nil {
			tb.Skip("MariaDB is not installed (apt-get install mariadb-server; .ci/run does)")
		}
	}
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		tb.Skip("mariadb-install-db is missing (apt-get install mariadb-server)")
	}
	s := &Server{Kind: "mariadb", tb: tb, bin: bin, port: freePort(tb)}
	s.dir = ownDir(tb, "mysql", "stockd-maria-")
	args := []string{"--no-defaults", "--datadir=" + s.dir + "/data", "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=mysql")
	}
	run(tb, exec.Command(install, args...))
	s.Start()
	tb.Cleanup(s.Kill)
	cfg := s.mysqlConfig("")
	db := openConfig(tb, cfg)
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE IF NOT EXISTS stockd"); err != nil {
		tb.Fatal(err)
	}
	s.DSN = "mysql://root@localhost/stockd?socket=" + s.dir + "/sock"
	return s
}

func (s *Server) mysqlConfig(db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "unix", s.dir+"/sock", db
	cfg.ParseTime = true
	return cfg
}

func openConfig(tb testing.TB, cfg *mysql.Config) *sql.DB {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return sql.OpenDB(conn)
}

// Start starts the server (again) and waits until it takes connections.
func (s *Server) Start() {
	s.tb.Helper()
	switch s.Kind {
	case "postgres":
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", s.port, s.dir)
		if out, err := s.pgCtl("start", "-w", "-t", "60", "-l", s.dir+"/server.log", "-o", opts); err != nil {
			log, _ := os.ReadFile(s.dir + "/server.log")
			s.tb.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	case "mariadb":
		args := []string{"--no-defaults", "--datadir=" + s.dir + "/data", "--socket=" + s.dir + "/sock",
			"--port=" + strconv.Itoa(s.port), "--bind-address=127.0.0.1", "--log-error=" + s.dir + "/error.log",
			"--pid-file=" + s.dir + "/mariadbd.pid", "--innodb-buffer-pool-size=128M"}
		if os.Geteuid() == 0 {
			args = append(args, "--user=mysql")
		}
		cmd := exec.Command(s.bin, args...)
		if err := cmd.Start(); err != nil {
			s.tb.Fatalf("start mariadbd: %v", err)
		}
		s.mu.Lock()
		s.cmd = cmd
		s.mu.Unlock()
		s.waitReady()
	}
}

// waitReady waits until MariaDB answers on its socket.
func (s *Server) waitReady() {
	s.tb.Helper()
	db := openConfig(s.tb, s.mysqlConfig(""))
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.dir + "/error.log")
			s.tb.Fatalf("mariadbd did not answer in 60 s: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond) // polling a server's socket with a deadline
	}
}

// Kill stops the server hard: pg_ctl stop -m immediate (no checkpoint,
// recovery at the next start), or SIGKILL of mariadbd. What was committed
// must survive it.
func (s *Server) Kill() {
	switch s.Kind {
	case "postgres":
		if out, err := s.pgCtl("stop", "-m", "immediate", "-w"); err != nil {
			s.tb.Logf("pg_ctl stop -m immediate: %v %s", err, out)
		}
	case "mariadb":
		s.mu.Lock()
		cmd := s.cmd
		s.cmd = nil
		s.mu.Unlock()
		if cmd != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
}

// DB opens a database/sql handle on the server (for the test's own
// checks and tampering), closed when the test ends.
func (s *Server) DB() *sql.DB {
	s.tb.Helper()
	var db *sql.DB
	if s.Kind == "postgres" {
		var err error
		if db, err = sql.Open("pgx", s.DSN); err != nil {
			s.tb.Fatal(err)
		}
	} else {
		db = openConfig(s.tb, s.mysqlConfig("stockd"))
	}
	s.tb.Cleanup(func() { db.Close() })
	return db
}

// Placeholder is the n-th bind parameter in this server's SQL.
func (s *Server) Placeholder(n int) string {
	if s.Kind == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}
