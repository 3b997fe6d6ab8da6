// Package feed is `stockd feed`, an example consumer of the order feed
// (DESIGN.md, "Orders flow out"): what a shop's order service would copy.
// It reads the events after its acknowledged cursor, prints each as one
// JSON line, acknowledges each page, and moves to the next node when one
// stops answering. It talks to stockd over HTTP only.
package feed

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
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
}

// Main runs the consumer until ctx ends, it has printed -max-events, or
// (with -exit-when-idle) a read finds nothing new.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	c := &consumer{o: o, out: stdout, log: stderr, client: &fasthttp.Client{ReadTimeout: o.wait + 10*time.Second, WriteTimeout: 10 * time.Second}}
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
	client *fasthttp.Client
	node   int // index of the target read from
}

// errGone is a cursor older than the feed's retention.
var errGone = errors.New("the cursor is older than the feed's retention")

func (c *consumer) run(ctx context.Context) error {
	cursor, err := c.startCursor(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.log, "stockd feed: consumer %s reading after %s from %s\n", c.o.consumer, cursor, c.o.targets[c.node])
	printed, failures := 0, 0
	for ctx.Err() == nil {
		var page struct {
			Events []json.RawMessage `json:"events"`
			Next   string            `json:"next"`
		}
		path := fmt.Sprintf("/v1/events?after=%s&limit=%d&wait=%s", url.QueryEscape(cursor), c.o.limit, c.o.wait)
		code, body, err := c.call(fasthttp.MethodGet, c.o.targets[c.node]+path, c.o.serviceToken, nil)
		switch {
		case err != nil || code >= 500:
			failures++
			next := (c.node + 1) % len(c.o.targets)
			fmt.Fprintf(c.log, "stockd feed: %s did not answer (%s); reading from %s\n", c.o.targets[c.node], describe(code, body, err), c.o.targets[next])
			c.node = next
			if !sleep(ctx, min(time.Duration(failures)*200*time.Millisecond, 5*time.Second)) {
				return nil
			}
			continue
		case code == fasthttp.StatusGone:
			return fmt.Errorf("%w (%s): events after %s were pruned; reconcile the orders and start again with -from 0", errGone, describe(code, body, nil), cursor)
		case code != fasthttp.StatusOK:
			return fmt.Errorf("read after %s: %s", cursor, describe(code, body, nil))
		}
		failures = 0
		if err := json.Unmarshal(body, &page); err != nil {
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
				if err := c.acknowledge(ctx, cursor); err != nil {
					return err
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
	for attempt := 0; ctx.Err() == nil && attempt < 3*len(c.o.targets); attempt++ {
		code, body, err := c.call(fasthttp.MethodGet, c.o.targets[c.node]+"/v1/consumers", c.o.serviceToken, nil)
		if err != nil || code != fasthttp.StatusOK {
			c.node = (c.node + 1) % len(c.o.targets)
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		var st struct {
			Consumers []struct {
				Name   string `json:"name"`
				Cursor string `json:"cursor"`
			} `json:"consumers"`
		}
		if err := json.Unmarshal(body, &st); err != nil {
			return "", fmt.Errorf("read the consumers: %w", err)
		}
		for _, k := range st.Consumers {
			if k.Name == c.o.consumer {
				return k.Cursor, nil
			}
		}
		return "0", nil
	}
	return "", fmt.Errorf("no node of %s answered GET /v1/consumers", strings.Join(c.o.targets, ","))
}

// acknowledge records cursor as the consumer's, through any node (a
// follower relays it to the leader).
func (c *consumer) acknowledge(ctx context.Context, cursor string) error {
	body := fmt.Appendf(nil, `{"cursor":%q}`, cursor)
	var last string
	for attempt := 0; ctx.Err() == nil && attempt < 3*len(c.o.targets); attempt++ {
		target := c.o.targets[(c.node+attempt)%len(c.o.targets)]
		code, resp, err := c.call(fasthttp.MethodPut, target+"/v1/consumers/"+url.PathEscape(c.o.consumer), c.o.adminToken, body)
		switch {
		case err == nil && code == fasthttp.StatusOK:
			return nil
		case err == nil && code < 500:
			return fmt.Errorf("acknowledge %s: %s", cursor, describe(code, resp, nil))
		}
		last = describe(code, resp, err)
		sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("acknowledge %s: no node took it (%s)", cursor, last)
}

func (c *consumer) call(method, uri, token string, body []byte) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(uri)
	req.Header.SetMethod(method)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBody(body)
	}
	if err := c.client.DoTimeout(req, resp, c.o.wait+10*time.Second); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

func describe(code int, body []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d %s", code, strings.TrimSpace(string(body)))
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
