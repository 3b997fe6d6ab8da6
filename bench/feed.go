package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// feedReader reads the order feed of a stockd row's first node while the
// row runs, as a shop's order service would (long-polling pages of up to
// 1000 events), and counts what it got: events per second through the
// feed, and what the feed costs the deduct path when the same row runs
// against nodes with -no-order-feed.
type feedReader struct {
	hc      *fasthttp.HostClient
	token   string
	cursor  string
	started time.Time
	events  atomic.Int64
	reads   atomic.Int64
	last    atomic.Uint64 // sequence of the last event read
	halt    chan struct{}
	done    chan struct{}
	err     atomic.Pointer[string]
	parser  fastjson.Parser // one reader goroutine at a time
}

// feedPage is what the reader keeps of GET /v1/events.
type feedPage struct {
	Events int
	Next   string
	Head   string
}

// startFeedReader starts a reader for st when on and st is a stockd row
// whose nodes record the feed; otherwise it returns nil (and record and
// stop do nothing).
func startFeedReader(ctx context.Context, st Strategy, on bool) *feedReader {
	s, ok := st.(*stockdStrategy)
	if !on || !ok || s.noFeed || len(s.clients) == 0 {
		return nil
	}
	f := &feedReader{hc: &fasthttp.HostClient{Addr: s.clients[0].Addr, ReadTimeout: requestTimeout, WriteTimeout: requestTimeout,
		IsTLS: s.clients[0].IsTLS, TLSConfig: s.clients[0].TLSConfig},
		token: s.service, halt: make(chan struct{}), done: make(chan struct{})}
	// Only the row's own events count: start at the head.
	page, err := f.read("0", 1, 0)
	if err != nil {
		f.fail(err)
		close(f.done)
		return f
	}
	f.cursor, f.started = page.Head, time.Now()
	go f.run(ctx)
	return f
}

func (f *feedReader) fail(err error) {
	s := err.Error()
	f.err.Store(&s)
}

func (f *feedReader) read(after string, limit int, wait time.Duration) (feedPage, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url(f.hc, fmt.Sprintf("/v1/events?after=%s&limit=%d&wait=%s", after, limit, wait)))
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	var p feedPage
	if err := f.hc.DoTimeout(req, resp, wait+requestTimeout); err != nil {
		return p, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return p, fmt.Errorf("read the feed: %d %s", resp.StatusCode(), strings.TrimSpace(string(resp.Body())))
	}
	// The harness's own cost counts as client CPU: parse without
	// reflection, as a consumer that cares about its CPU would.
	v, err := f.parser.ParseBytes(resp.Body())
	if err != nil {
		return p, fmt.Errorf("read the feed: %w", err)
	}
	p.Events = len(v.GetArray("events"))
	p.Next, p.Head = string(v.GetStringBytes("next")), string(v.GetStringBytes("head"))
	return p, nil
}

func (f *feedReader) run(ctx context.Context) {
	defer close(f.done)
	for {
		select {
		case <-f.halt:
			return
		case <-ctx.Done():
			return
		default:
		}
		page, err := f.read(f.cursor, 1000, time.Second)
		f.reads.Add(1)
		if err != nil {
			f.fail(err)
			return
		}
		if n := page.Events; n > 0 {
			f.events.Add(int64(n))
			f.cursor = page.Next
			f.last.Store(cursorSeq(page.Next))
		}
	}
}

// cursorSeq is the sequence part of a cursor "<index>-<sequence>".
func cursorSeq(c string) uint64 {
	_, seq, _ := strings.Cut(c, "-")
	var n uint64
	fmt.Sscan(seq, &n)
	return n
}

func (f *feedReader) stop() {
	if f == nil {
		return
	}
	select {
	case <-f.done:
	default:
		close(f.halt)
		<-f.done
	}
}

// record stops the reader and puts its figures in run.
func (f *feedReader) record(run *Run) {
	if f == nil {
		return
	}
	elapsed := time.Since(f.started)
	f.stop()
	run.FeedEvents = f.events.Load()
	if elapsed > 0 {
		run.FeedPerSec = float64(run.FeedEvents) / elapsed.Seconds()
	}
	if page, err := f.read("0", 1, 0); err == nil {
		if head := cursorSeq(page.Head); head > f.last.Load() {
			run.FeedBehind = int64(head - f.last.Load())
		}
	}
	if reads := f.reads.Load(); reads > 0 {
		run.FeedNote = fmt.Sprintf("(%d reads, %.0f events a read)", reads, float64(run.FeedEvents)/float64(reads))
	}
	if e := f.err.Load(); e != nil {
		run.FeedNote = "(reader stopped: " + *e + ")"
	}
}
