package engine

import (
	"sync"
	"time"
)

// deadlines hands out channels that close once a duration has passed,
// rounded up to deadlineGrain, shared by every caller whose deadline falls
// in the same grain: a waiting deduct needs a bound, not its own timer,
// and a timer per request costs an allocation and a timer-heap insert and
// removal on the hot path. One timer per grain with waiters closes them.
type deadlines struct {
	mu      sync.Mutex
	byGrain map[int64]chan struct{}
	now     func() time.Time
}

// deadlineGrain is the resolution of deadlines: answers that time out do
// so up to this much late.
const deadlineGrain = 50 * time.Millisecond

func newDeadlines(now func() time.Time) *deadlines {
	return &deadlines{byGrain: map[int64]chan struct{}{}, now: now}
}

// after returns a channel closed no earlier than d from now, and at most
// deadlineGrain later. Safe for concurrent use.
func (dl *deadlines) after(d time.Duration) <-chan struct{} {
	at := dl.now().Add(d)
	grain := (at.UnixNano() + int64(deadlineGrain) - 1) / int64(deadlineGrain)
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if ch, ok := dl.byGrain[grain]; ok {
		return ch
	}
	ch := make(chan struct{})
	dl.byGrain[grain] = ch
	wait := time.Until(time.Unix(0, grain*int64(deadlineGrain)))
	time.AfterFunc(max(wait, 0), func() {
		dl.mu.Lock()
		delete(dl.byGrain, grain)
		dl.mu.Unlock()
		close(ch)
	})
	return ch
}
