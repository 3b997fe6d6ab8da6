// Package feed is `stockd feed`, an example consumer of the order feed
// (docs/feed-and-lottery.md): what a shop's order service would copy.
// It reads the events after its acknowledged cursor, prints each as one
// JSON line, acknowledges each page, and moves to the next node when one
// stops answering (package client does the moving). It talks to stockd
// over HTTP only.
package feed

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"stockd.dev/stockd/client"
)

// options are the consumer's flags.
type options struct {
	targets      []string
	consumer     string
	from         string
	limit        int
	wait         time.Duration
	ack          bool
	adminToken   string
	serviceToken string
	maxEvents    int
	exitIdle     bool
	// caFile, certFile and keyFile: HTTPS to the nodes.
	caFile, certFile, keyFile string
}

// Main runs the consumer until ctx ends, it has printed -max-events, or
// (with -exit-when-idle) a read finds nothing new.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	ccfg := client.Config{Endpoints: o.targets, ServiceToken: o.serviceToken, AdminToken: o.adminToken,
		AttemptTimeout: o.wait + 10*time.Second}
	if o.caFile != "" || o.certFile != "" {
		if ccfg.TLS, err = client.TLSFiles(o.caFile, o.certFile, o.keyFile); err != nil {
			return err
		}
	}
	cl, err := client.New(ccfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	c := &consumer{o: o, out: stdout, log: stderr, client: cl}
	return c.run(ctx)
}

func parse(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("stockd feed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	targets := fs.String("target", "http://127.0.0.1:8080", "comma-separated stockd node URLs; the consumer moves to the next when one stops answering")
	fs.StringVar(&o.consumer, "consumer", "", "the consumer's name: its acknowledged cursor is kept in the cluster (required)")
	fs.StringVar(&o.from, "from", "", "read after this cursor instead of the consumer's acknowledged one (\"0\": from the oldest event kept)")
	fs.IntVar(&o.limit, "limit", 100, "events per read (1-1000)")
	fs.DurationVar(&o.wait, "wait", 10*time.Second, "how long a read waits for new events (up to 30s)")
	fs.BoolVar(&o.ack, "ack", true, "acknowledge each page after printing it (needs the admin token)")
	fs.StringVar(&o.adminToken, "admin-token", os.Getenv("STOCKD_ADMIN_TOKEN"), "admin token, for acknowledging (default $STOCKD_ADMIN_TOKEN)")
	fs.StringVar(&o.serviceToken, "service-token", os.Getenv("STOCKD_SERVICE_TOKEN"), "service token, for reading (default $STOCKD_SERVICE_TOKEN)")
	fs.IntVar(&o.maxEvents, "max-events", 0, "stop after printing this many events (0: no limit)")
	fs.BoolVar(&o.exitIdle, "exit-when-idle", false, "stop when a read finds no new event (for scripts)")
	fs.StringVar(&o.caFile, "ca", "", "CA bundle (PEM) that checks https:// targets")
	fs.StringVar(&o.certFile, "cert", "", "client certificate (PEM), for nodes that require one (-http-client-ca)")
	fs.StringVar(&o.keyFile, "key", "", "the key of -cert (PEM)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd feed -consumer NAME [-target URL,...] [flags]\n\nPrints the order feed's events as JSON lines and acknowledges them.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.consumer == "" {
		return nil, errors.New("-consumer is required: the cluster keeps each consumer's cursor by name")
	}
	if o.limit < 1 || o.limit > 1000 || o.wait < 0 || o.wait > 30*time.Second {
		return nil, fmt.Errorf("-limit %d must be 1-1000 and -wait %s 0-30s", o.limit, o.wait)
	}
	for _, t := range strings.Split(*targets, ",") {
		if t = strings.TrimRight(strings.TrimSpace(t), "/"); t != "" {
			if _, err := url.Parse(t); err != nil || !strings.HasPrefix(t, "http") {
				return nil, fmt.Errorf("-target %q is not an http URL", t)
			}
			o.targets = append(o.targets, t)
		}
	}
	if len(o.targets) == 0 {
		return nil, errors.New("-target names no node")
	}
	return o, nil
}

type consumer struct {
	o      *options
	out    io.Writer
	log    io.Writer
	client *client.Client
}

// errGone is a cursor older than the feed's retention.
var errGone = errors.New("the cursor is older than the feed's retention")

func (c *consumer) run(ctx context.Context) error {
	cursor, err := c.startCursor(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.log, "stockd feed: consumer %s reading after %s from %s\n", c.o.consumer, cursor, strings.Join(c.o.targets, ","))
	printed := 0
	for ctx.Err() == nil {
		// The client moves to the next node when one does not answer.
		page, err := c.client.Events(ctx, cursor, c.o.limit, c.o.wait)
		switch {
		case errors.Is(err, client.ErrCursorExpired):
			return fmt.Errorf("%w (%v): events after %s were pruned; reconcile the orders and start again with -from 0", errGone, err, cursor)
		case errors.Is(err, client.ErrNotDefinite) && ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("read after %s: %w", cursor, err)
		}
		for _, e := range page.Events {
			if _, err := fmt.Fprintf(c.out, "%s\n", e); err != nil {
				return err
			}
			printed++
		}
		if len(page.Events) > 0 {
			cursor = page.Next
			if c.o.ack {
				if err := c.client.AckConsumer(ctx, c.o.consumer, cursor); err != nil {
					return fmt.Errorf("acknowledge %s: %w", cursor, err)
				}
			}
		}
		if c.o.maxEvents > 0 && printed >= c.o.maxEvents || c.o.exitIdle && len(page.Events) == 0 {
			return nil
		}
	}
	return nil
}

// startCursor is -from, else the consumer's acknowledged cursor, else the
// start of the feed.
func (c *consumer) startCursor(ctx context.Context) (string, error) {
	if c.o.from != "" {
		return c.o.from, nil
	}
	cursor, found, err := c.client.ConsumerCursor(ctx, c.o.consumer)
	switch {
	case err != nil:
		return "", fmt.Errorf("read the consumers from %s: %w", strings.Join(c.o.targets, ","), err)
	case !found:
		return "0", nil
	}
	return cursor, nil
}
