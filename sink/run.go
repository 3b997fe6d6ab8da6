package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fastjson"

	"stockd.dev/stockd/client"
)

// runner is one run of the sink.
type runner struct {
	o                     *options
	limit                 int
	wait, progress        time.Duration
	metricsAddr           string
	exitIdle, allowPruned bool

	log    *slog.Logger
	client *client.Client
	store  *store

	cursor string // what the database holds, as far as this run knows
	acked  string // what stockd was told last

	// For progress and metrics.
	events, batches, retries, ackFailures atomic.Uint64
	headSeq, cursorSeq                    atomic.Uint64
	newestAt                              atomic.Int64 // the newest event written, unix nanos
	lastCommit                            atomic.Int64
}

// errGone is a cursor older than the feed's retention.
var errGone = errors.New("the database's cursor is older than the feed's retention (410)")

func (r *runner) run(ctx context.Context) error {
	var err error
	if r.cursor, err = r.store.cursor(ctx); err != nil {
		return err
	}
	r.cursorSeq.Store(mustSeq(r.cursor))
	if err := r.registerConsumer(ctx); err != nil {
		return err
	}
	r.log.Info("sink started", "table", r.store.t.orders, "db", r.store.t.d.name, "cursor", r.cursor, "targets", r.o.targets)
	var report <-chan time.Time
	if r.progress > 0 {
		t := time.NewTicker(r.progress)
		defer t.Stop()
		report = t.C
	}
	lastEvents, lastReport := uint64(0), time.Now()
	// The next page is read while this one is written: a reader goroutine
	// runs one page ahead, after the cursor this run expects the
	// database to hold. When the database says otherwise (another sink,
	// a hand), the reader starts again from the database's cursor.
	pages, stopReading := r.readPages(ctx, r.cursor)
	defer func() { stopReading() }()
	for {
		select {
		case now := <-report:
			n := r.events.Load()
			r.log.Info("progress", "cursor", r.cursor, "events", n, "events_per_s", fmt.Sprintf("%.0f", float64(n-lastEvents)/now.Sub(lastReport).Seconds()),
				"lag_events", r.lagEvents(), "lag_s", fmt.Sprintf("%.1f", r.lagSeconds()))
			lastEvents, lastReport = n, now
		case p, ok := <-pages:
			if !ok {
				return nil // ctx ended
			}
			idle, err := r.write(ctx, p)
			if err != nil {
				return err
			}
			if idle && r.exitIdle {
				r.log.Info("caught up", "cursor", r.cursor, "events", r.events.Load())
				return nil
			}
			if len(p.events) > 0 && r.cursor != p.events[len(p.events)-1].Cursor {
				stopReading()
				pages, stopReading = r.readPages(ctx, r.cursor)
			}
		}
	}
}

// page is one read of the feed: the events after cursor after, and the
// feed's head; or the read's error, the reader's last page.
type page struct {
	after  string
	events []event
	head   string
	err    error
}

// readPages reads the feed after from, page after page, one page ahead of
// the writer, until stop or ctx ends (the channel closes, once the reader
// returned) or a read fails.
func (r *runner) readPages(ctx context.Context, from string) (pages <-chan page, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan page, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		var parser fastjson.Parser
		after := from
		for ctx.Err() == nil {
			p := page{after: after}
			body, err := r.client.EventsJSON(ctx, after, r.limit, r.wait)
			if err == nil {
				p.events, p.head, err = parsePage(&parser, body)
			}
			if err != nil && ctx.Err() != nil {
				return
			}
			p.err = err
			select {
			case out <- p:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
			if n := len(p.events); n > 0 {
				after = p.events[n-1].Cursor
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// registerConsumer makes sure stockd knows the consumer, so the feed keeps
// the events after it; creating it takes the admin token.
func (r *runner) registerConsumer(ctx context.Context) error {
	theirs, found, err := r.client.ConsumerCursor(ctx, r.o.consumer)
	if err != nil {
		return fmt.Errorf("read the consumers: %w", err)
	}
	if found {
		if theirs != r.cursor {
			r.log.Info("stockd's cursor for the consumer differs from the database's: reading after the database's", "stockd", theirs, "database", r.cursor)
		}
		return nil
	}
	if err := r.client.AckConsumer(ctx, r.o.consumer, r.cursor); err != nil {
		return fmt.Errorf("register consumer %s in stockd (the first run needs -admin-token): %w", r.o.consumer, err)
	}
	r.acked = r.cursor
	return nil
}

// write writes one page; idle when it was empty.
func (r *runner) write(ctx context.Context, p page) (idle bool, err error) {
	switch {
	case errors.Is(p.err, client.ErrCursorExpired):
		return false, fmt.Errorf("%w: events after %s were pruned before the table held them; reconcile, then start a new table or consumer (%v)", errGone, p.after, p.err)
	case p.err != nil:
		return false, fmt.Errorf("read the feed after %s: %w", p.after, p.err)
	case p.after != r.cursor:
		return false, fmt.Errorf("BUG: a page read after %s, the database is at %s", p.after, r.cursor)
	}
	if s, err := cursorSeq(p.head); err == nil {
		r.headSeq.Store(s)
	}
	events := p.events
	if len(events) == 0 {
		r.ack(ctx)
		return true, nil
	}
	if r.cursor == "0" && !r.allowPruned {
		if first, _ := cursorSeq(events[0].Cursor); first != 1 {
			return false, fmt.Errorf("the feed starts at %s: the events before it were pruned, so their orders would never reach the table (reconcile them, then run with -allow-pruned-start)", events[0].Cursor)
		}
	}
	rows, err := fold(r.cursor, events)
	if err != nil {
		return false, err
	}
	next := events[len(events)-1].Cursor
	if err := r.commit(ctx, next, rows); err != nil {
		return false, err
	}
	if r.cursor != next {
		return false, nil // the database was elsewhere: read again from there
	}
	r.events.Add(uint64(len(events)))
	r.batches.Add(1)
	if at, err := time.Parse(time.RFC3339Nano, events[len(events)-1].At); err == nil {
		r.newestAt.Store(at.UnixNano())
	}
	r.lastCommit.Store(time.Now().UnixNano())
	if ackDelayForTests > 0 {
		r.log.Info("committed, acknowledging after the test's delay", "cursor", r.cursor)
		time.Sleep(ackDelayForTests)
	}
	r.ack(ctx)
	return false, nil
}

// commit writes rows and next until the database holds them. After an
// error it reads the database's cursor: the commit may have happened (a
// connection lost at COMMIT), or another sink may have moved it.
func (r *runner) commit(ctx context.Context, next string, rows []*row) error {
	from := r.cursor
	err := retry(ctx, r.log, "write to the database", func() error {
		err := r.store.write(ctx, from, next, rows)
		if err == nil || !retryable(err) {
			return err
		}
		var moved *errCursorMoved
		if errors.As(err, &moved) {
			return err
		}
		r.retries.Add(1)
		if have, rerr := r.store.cursor(ctx); rerr == nil && have != from {
			return &errCursorMoved{want: from, have: have} // it committed, or someone moved it
		}
		return err
	})
	var moved *errCursorMoved
	switch {
	case errors.As(err, &moved) && moved.have == next:
		r.log.Info("the write committed though its answer was lost", "cursor", next)
	case errors.As(err, &moved):
		r.log.Warn(moved.Error())
		r.cursor = moved.have
		r.cursorSeq.Store(mustSeq(moved.have))
		return nil
	case err != nil:
		return fmt.Errorf("write events after %s: %w", from, err)
	}
	r.cursor = next
	r.cursorSeq.Store(mustSeq(next))
	return nil
}

func mustSeq(c string) uint64 {
	s, _ := cursorSeq(c)
	return s
}

// ack tells stockd the consumer's cursor is the database's. A failure is
// logged and tried again after the next page: the feed only keeps more.
func (r *runner) ack(ctx context.Context) {
	if r.acked == r.cursor {
		return
	}
	if _, err := r.client.AdvanceConsumer(ctx, r.o.consumer, r.cursor); err != nil {
		if ctx.Err() == nil {
			r.ackFailures.Add(1)
			r.log.Warn("acknowledge in stockd", "cursor", r.cursor, "err", err)
		}
		return
	}
	r.acked = r.cursor
}

func (r *runner) lagEvents() uint64 {
	h, c := r.headSeq.Load(), r.cursorSeq.Load()
	if h <= c {
		return 0
	}
	return h - c
}

// lagSeconds is how old the newest order in the table is while the feed
// holds newer ones (0 when caught up).
func (r *runner) lagSeconds() float64 {
	at := r.newestAt.Load()
	if r.lagEvents() == 0 || at == 0 {
		return 0
	}
	return time.Since(time.Unix(0, at)).Seconds()
}

// serveMetrics serves /metrics on -metrics until stop.
func (r *runner) serveMetrics() (stop func(), err error) {
	ln, err := net.Listen("tcp", r.metricsAddr)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		metrics.WriteCounterUint64(w, "stockd_sink_events_total", r.events.Load())
		metrics.WriteCounterUint64(w, "stockd_sink_transactions_total", r.batches.Load())
		metrics.WriteCounterUint64(w, "stockd_sink_write_retries_total", r.retries.Load())
		metrics.WriteCounterUint64(w, "stockd_sink_ack_failures_total", r.ackFailures.Load())
		metrics.WriteGaugeUint64(w, "stockd_sink_cursor_seq", r.cursorSeq.Load())
		metrics.WriteGaugeUint64(w, "stockd_sink_head_seq", r.headSeq.Load())
		metrics.WriteGaugeUint64(w, "stockd_sink_lag_events", r.lagEvents())
		metrics.WriteGaugeFloat64(w, "stockd_sink_lag_seconds", r.lagSeconds())
		if at := r.lastCommit.Load(); at != 0 {
			metrics.WriteGaugeFloat64(w, "stockd_sink_last_commit_timestamp_seconds", float64(at)/1e9)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	r.log.Info("metrics", "addr", ln.Addr().String())
	return func() { srv.Close(); wg.Wait() }, nil
}
