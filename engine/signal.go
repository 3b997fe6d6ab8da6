package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// signal wakes every goroutine waiting for a sale's stock to change. It is
// used only off the fast path, by deducts waiting for a lease.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next broadcast.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// poller runs, every stockPollInterval and only while any deduct waits for
// stock, one check for all of them (Engine.pollWaiting): a thousand
// waiting buyers must not each look at the ledger every few
// milliseconds.
type poller struct {
	waiters atomic.Int64
	wake    chan struct{}
	ticks   atomic.Uint64
}

func newPoller() *poller { return &poller{wake: make(chan struct{}, 1)} }

func (p *poller) enter() {
	if p.waiters.Add(1) == 1 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

func (p *poller) leave() { p.waiters.Add(-1) }

// run calls tick, with the count of ticks so far, until stop closes.
func (p *poller) run(stop <-chan struct{}, tick func(n uint64)) {
	t := time.NewTicker(stockPollInterval)
	defer t.Stop()
	for {
		if p.waiters.Load() == 0 {
			t.Stop()
			select {
			case <-p.wake:
				t.Reset(stockPollInterval)
			case <-stop:
				return
			}
		}
		select {
		case <-t.C:
			tick(p.ticks.Add(1))
		case <-stop:
			return
		}
	}
}

func (s *signal) broadcast() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}
