// Package sink is `stockd sink` and `stockd reconcile` (docs/sink.md):
// the order feed into the shop's PostgreSQL or MySQL/MariaDB order table,
// exactly once, and the check that the table and stockd's ledger agree.
//
// Exactly once comes from the database, not from stockd: each page of
// events is written with the feed cursor it reaches in one transaction,
// and the sink always resumes from the cursor in the database. stockd's
// consumer cursor is only acknowledged after the commit, so the feed keeps
// what the table does not hold yet (and archiving waits for it).
package sink

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"stockd.dev/stockd/client"
)

// options are the flags both commands share.
type options struct {
	targets                   []string
	dsn, consumer, table      string
	caFile, certFile, keyFile string
	adminToken, serviceToken  string
}

func (o *options) register(fs *flag.FlagSet) *string {
	targets := fs.String("target", "http://127.0.0.1:8080", "comma-separated stockd node URLs; the sink moves to the next when one stops answering")
	fs.StringVar(&o.dsn, "db", "", "the shop's database: postgres://user:password@host:5432/shop or mysql://user:password@host:3306/shop")
	fs.StringVar(&o.table, "table", "stockd_orders", "the order table (the cursor table is <table>_cursor)")
	fs.StringVar(&o.caFile, "ca", "", "CA bundle (PEM) that checks https:// targets")
	fs.StringVar(&o.certFile, "cert", "", "client certificate (PEM), for nodes that require one")
	fs.StringVar(&o.keyFile, "key", "", "the key of -cert (PEM)")
	fs.StringVar(&o.adminToken, "admin-token", os.Getenv("STOCKD_ADMIN_TOKEN"), "admin token: creates the consumer on the first run (default $STOCKD_ADMIN_TOKEN)")
	fs.StringVar(&o.serviceToken, "service-token", os.Getenv("STOCKD_SERVICE_TOKEN"), "service token: reads the feed and acknowledges the consumer (default $STOCKD_SERVICE_TOKEN)")
	return targets
}

// envPrefix starts the variables that set the flags the command line
// leaves unset: STOCKD_SINK_DB for -db, STOCKD_SINK_TARGET for -target.
// The tokens are STOCKD_ADMIN_TOKEN and STOCKD_SERVICE_TOKEN, as for the
// other commands.
const envPrefix = "STOCKD_SINK_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets each flag of fs the command line did not give from its
// STOCKD_SINK_ variable, when set (only those in names, when names is
// not nil). It returns the STOCKD_SINK_ variables that name no flag.
func applyEnv(fs *flag.FlagSet, names map[string]bool) (unknown []string, err error) {
	given, known := map[string]bool{}, map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		known[envName(f.Name)] = true
		if given[f.Name] || err != nil || names != nil && !names[f.Name] || f.Name == "admin-token" || f.Name == "service-token" {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, serr)
			}
		}
	})
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) && !known[k] {
			unknown = append(unknown, k)
		}
	}
	return unknown, err
}

func (o *options) check(targets string) error {
	for _, t := range strings.Split(targets, ",") {
		if t = strings.TrimRight(strings.TrimSpace(t), "/"); t != "" {
			if u, err := url.Parse(t); err != nil || u.Host == "" || !strings.HasPrefix(t, "http") {
				return fmt.Errorf("-target %q is not an http URL", t)
			}
			o.targets = append(o.targets, t)
		}
	}
	switch {
	case len(o.targets) == 0:
		return errors.New("-target names no node")
	case o.dsn == "":
		return errors.New("-db is required: the database the orders go into (postgres:// or mysql://)")
	case !tableNameRE.MatchString(o.table):
		return fmt.Errorf("-table %q: want a lower-case name of a-z, 0-9 and _ (at most 56)", o.table)
	case o.consumer == "" || len(o.consumer) > 128 || strings.ContainsFunc(o.consumer, badNameRune):
		return fmt.Errorf("-consumer %q: want 1 to 128 of a-z A-Z 0-9 and . _ - : (the name stockd keeps its cursor by)", o.consumer)
	}
	return nil
}

func badNameRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r))
}

// client opens the stockd client the options describe; wait is the
// longest long-poll it will make.
func (o *options) client(wait time.Duration) (*client.Client, error) {
	cfg := client.Config{Endpoints: o.targets, ServiceToken: o.serviceToken, AdminToken: o.adminToken,
		AttemptTimeout: wait + 10*time.Second}
	if o.caFile != "" || o.certFile != "" {
		var err error
		if cfg.TLS, err = client.TLSFiles(o.caFile, o.certFile, o.keyFile); err != nil {
			return nil, err
		}
	}
	return client.New(cfg)
}

// open opens the database and its tables (creating or checking them),
// waiting for a database that does not answer yet until ctx ends.
func (o *options) open(ctx context.Context, log *slog.Logger) (*store, error) {
	db, d, err := openDB(o.dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	db.SetConnMaxIdleTime(time.Minute)
	s := &store{db: db, t: tables{d: d, orders: o.table, cursor: o.table + "_cursor"}, consumer: o.consumer}
	err = retry(ctx, log, "open the database", func() error {
		if err := db.PingContext(ctx); err != nil {
			return err
		}
		return s.t.ensure(ctx, db)
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// retry runs f until it succeeds, fails in a way that does not pass by
// itself, or ctx ends; it logs each failure and backs off up to 5 s.
func retry(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		log.Warn(what+": retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Main runs `stockd sink` until ctx ends (or, with -exit-when-idle, until
// a read finds nothing new).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	targets := o.register(fs)
	r := &runner{o: o}
	fs.StringVar(&o.consumer, "consumer", "", "the consumer's name in stockd and in the cursor table (required)")
	fs.IntVar(&r.limit, "limit", 1000, "events per read and per transaction (1-1000)")
	fs.DurationVar(&r.wait, "wait", 10*time.Second, "how long a read waits for new events (up to 30s)")
	fs.DurationVar(&r.progress, "progress", time.Minute, "how often to log progress (0: never)")
	fs.StringVar(&r.metricsAddr, "metrics", "", "serve Prometheus metrics on this address (host:port)")
	fs.BoolVar(&r.exitIdle, "exit-when-idle", false, "stop once a read finds nothing new (for scripts)")
	fs.BoolVar(&r.allowPruned, "allow-pruned-start", false, "on a first run, start from the oldest event the feed kept even when older ones were pruned")
	checkOnly := fs.Bool("check-config", false, "check the flags and STOCKD_SINK_ variables, print what the sink would do, and exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd sink -db DSN -consumer NAME [-target URL,...] [flags]\n\nWrites the order feed into the shop's database, exactly once.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	unknown, err := applyEnv(fs, nil)
	if err != nil {
		return err
	}
	if err := o.check(*targets); err != nil {
		return err
	}
	if _, _, err := openDB(o.dsn); err != nil {
		return err
	}
	if *checkOnly {
		for _, v := range unknown {
			fmt.Fprintf(stderr, "stockd sink: warning: %s matches no flag and is ignored (a renamed flag?)\n", v)
		}
		fmt.Fprintf(stdout, "stockd sink: the configuration checks out: consumer %s from %s into %s, table %s\n",
			o.consumer, strings.Join(o.targets, ","), redact(o.dsn), o.table)
		return nil
	}
	if r.limit < 1 || r.limit > 1000 || r.wait < 0 || r.wait > 30*time.Second {
		return fmt.Errorf("-limit %d must be 1-1000 and -wait %s 0-30s", r.limit, r.wait)
	}
	r.log = slog.New(slog.NewTextHandler(stderr, nil)).With("component", "sink", "consumer", o.consumer)
	for _, v := range unknown {
		r.log.Warn("a variable matches no flag and is ignored (a renamed flag?)", "name", v)
	}
	cl, err := o.client(r.wait)
	if err != nil {
		return err
	}
	defer cl.Close()
	r.client = cl
	if r.metricsAddr != "" {
		stop, err := r.serveMetrics()
		if err != nil {
			return err
		}
		defer stop()
	}
	r.store, err = o.open(ctx, r.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer r.store.db.Close()
	err = r.run(ctx)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, client.ErrNotDefinite)) {
		r.log.Info("stopped", "cursor", r.cursor)
		return nil
	}
	return err
}

// ackDelayForTests holds each acknowledgement back after its commit, so a
// test can kill the sink in between (STOCKD_SINK_TEST_ACK_DELAY, a
// duration).
var ackDelayForTests = func() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("STOCKD_SINK_TEST_ACK_DELAY"))
	return d
}()
