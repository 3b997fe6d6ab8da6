// Package deadline hands out shared timeouts: channels that close once a
// duration has passed, one timer per grain for every waiter in it.
package deadline

import (
	"sync"
	"time"
)

// Set hands out channels that close once a duration has passed,
// rounded up to deadlineGrain, shared by every caller whose deadline falls
// in the same grain: a waiting deduct needs a bound, not its own timer,
// and a timer per request costs an allocation and a timer-heap insert and
// removal on the hot path. One timer per grain with waiters closes them.
type Set struct {
	mu      sync.Mutex
	byGrain map[int64]chan struct{}
	now     func() time.Time
	// ended, once set by End, is the channel every later After returns:
	// closed already.
	ended chan struct{}
}

// deadlineGrain is the resolution of deadlines: answers that time out do
// so up to this much late.
const deadlineGrain = 50 * time.Millisecond

// New is an empty set of deadlines on the clock now.
func New(now func() time.Time) *Set {
	return &Set{byGrain: map[int64]chan struct{}{}, now: now}
}

// After returns a channel closed no earlier than d from now, and at most
// deadlineGrain later. Safe for concurrent use.
func (dl *Set) After(d time.Duration) <-chan struct{} {
	at := dl.now().Add(d)
	grain := (at.UnixNano() + int64(deadlineGrain) - 1) / int64(deadlineGrain)
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.ended != nil {
		return dl.ended
	}
	if ch, ok := dl.byGrain[grain]; ok {
		return ch
	}
	ch := make(chan struct{})
	dl.byGrain[grain] = ch
	wait := time.Until(time.Unix(0, grain*int64(deadlineGrain)))
	time.AfterFunc(max(wait, 0), func() {
		dl.mu.Lock()
		defer dl.mu.Unlock()
		if _, ok := dl.byGrain[grain]; ok { // end may have closed it
			delete(dl.byGrain, grain)
			close(ch)
		}
	})
	return ch
}

// End closes every channel handed out, at once, and makes every later
// after return a closed one: its waiters give up early (the engine ends
// its waits this way when it stops, so that a wait selects on one shared
// channel instead of one for each reason to stop). Safe to call more than
// once.
func (dl *Set) End() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.ended != nil {
		return
	}
	dl.ended = make(chan struct{})
	close(dl.ended)
	for grain, ch := range dl.byGrain {
		delete(dl.byGrain, grain)
		close(ch)
	}
}
