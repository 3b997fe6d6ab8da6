package coarsedeadline

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// pair returns a connection accepted by a coarse listener swept every g
// and the client end dialled to it.
func pair(t *testing.T, g time.Duration) (*Listener, net.Conn, net.Conn) {
	t.Helper()
	return enforcedPair(t, g, Timeouts{})
}

// waitSweptPast waits until the sweeper has run at or after at.
func waitSweptPast(t *testing.T, l *Listener, at time.Time) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for l.now.Load() < at.UnixNano() {
		if time.Now().After(end) {
			t.Fatalf("the sweeper has not run past %v", at)
		}
		time.Sleep(time.Millisecond)
	}
}

func readByte(c net.Conn) error {
	var b [1]byte
	_, err := io.ReadFull(c, b[:])
	return err
}

func TestConn_FarDeadlineFiresAfterItsTime(t *testing.T) {
	const g = 10 * time.Millisecond
	_, server, _ := pair(t, g)
	deadline := time.Now().Add(100 * time.Millisecond) // far: more than 2g away
	if err := server.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	err := readByte(server)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("read: %v is not a net.Error timeout", err)
	}
	if now := time.Now(); now.Before(deadline) {
		t.Fatalf("read timed out %v before its deadline", deadline.Sub(now))
	}
}

func TestConn_DeadlineMovedLaterDoesNotFire(t *testing.T) {
	const g = 5 * time.Millisecond
	l, server, client := pair(t, g)
	first := time.Now().Add(30 * time.Millisecond)
	server.SetReadDeadline(first)
	server.SetReadDeadline(time.Now().Add(time.Hour))
	waitSweptPast(t, l, first.Add(g))
	client.Write([]byte{1})
	if err := readByte(server); err != nil {
		t.Fatalf("read after the deadline moved an hour on: %v", err)
	}
}

func TestConn_FiredDeadlineIsUndoneByTheNext(t *testing.T) {
	f := func(next time.Time) {
		t.Helper()
		const g = 5 * time.Millisecond
		_, server, client := pair(t, g)
		server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if err := readByte(server); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("first read: %v, want a deadline error", err)
		}
		server.SetReadDeadline(next)
		client.Write([]byte{1})
		if err := readByte(server); err != nil {
			t.Fatalf("read after a new deadline (%v): %v", next, err)
		}
	}
	f(time.Now().Add(time.Hour)) // a far one
	f(time.Time{})               // none
}

func TestConn_NearDeadlineIsExact(t *testing.T) {
	_, server, _ := pair(t, time.Hour) // the sweeper never runs
	server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if err := readByte(server); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	server.SetWriteDeadline(time.Now())
	if _, err := server.Write([]byte{1}); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: %v, want a deadline error", err)
	}
}

func TestConn_WriteDeadlineFires(t *testing.T) {
	const g = 5 * time.Millisecond
	_, server, _ := pair(t, g)
	server.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	// The client never reads: the socket buffers fill and the write blocks.
	buf := make([]byte, 1<<20)
	var err error
	for range 1000 {
		if _, err = server.Write(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: %v, want a deadline error", err)
	}
}

// TestConn_RacingSweeperNeverFiresTheLatestDeadline sets a deadline that
// is about to expire and then moves it an hour on, many times, while the
// sweeper runs every millisecond: some of the first deadlines fire
// between the two calls, and the second call must undo every one of them.
func TestConn_RacingSweeperNeverFiresTheLatestDeadline(t *testing.T) {
	const g = time.Millisecond
	l, server, client := pair(t, g)
	fired := 0
	for i := range 500 {
		soon := time.Now().Add(2*g + time.Duration(i%7)*100*time.Microsecond)
		server.SetReadDeadline(soon)
		for time.Now().Before(soon.Add(time.Duration(i%3) * g)) {
			// spin: the sweeper may fire soon meanwhile
		}
		if server.(*conn).read.Load() == realDeadline {
			fired++
		}
		server.SetReadDeadline(time.Now().Add(time.Hour))
		client.Write([]byte{1})
		if err := readByte(server); err != nil {
			t.Fatalf("round %d: read after the deadline moved an hour on: %v", i, err)
		}
	}
	if fired == 0 {
		t.Fatalf("the sweeper fired none of 500 expiring deadlines: the race was not exercised")
	}
	t.Logf("%d of 500 deadlines fired before they were moved (sweeps at %v)", fired, time.Unix(0, l.now.Load()).Format(time.StampMicro))
}

func TestListener_SweeperEndsWithTheLastConn(t *testing.T) {
	l, server, _ := pair(t, time.Millisecond)
	l.Close()
	select {
	case <-l.Done():
		t.Fatal("the sweeper ended while a connection was open")
	default:
	}
	if n := l.Conns(); n != 1 {
		t.Fatalf("%d connections watched, want 1", n)
	}
	server.Close()
	server.Close() // twice is harmless
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the sweeper did not end after the listener and its connection closed")
	}
	if n := l.Conns(); n != 0 {
		t.Fatalf("%d connections watched after close, want 0", n)
	}
}

// enforcedPair is pair on a listener that enforces timeouts to (none
// when zero).
func enforcedPair(t *testing.T, g time.Duration, to Timeouts) (*Listener, net.Conn, net.Conn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(raw, g).Enforce(to)
	t.Cleanup(func() { l.Close() })
	client, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return l, server, client
}

// timedOut fails unless err is a deadline error that came no earlier than
// min after start.
func timedOut(t *testing.T, what string, err error, start time.Time, min time.Duration) {
	t.Helper()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: %v, want a deadline error", what, err)
	}
	if took := time.Since(start); took < min {
		t.Fatalf("%s timed out after %v, before its %v", what, took, min)
	}
}

func TestEnforce_FirstRequestHasTheReadTimeoutFromTheAccept(t *testing.T) {
	const g = 5 * time.Millisecond
	start := time.Now()
	_, server, _ := enforcedPair(t, g, Timeouts{Read: 60 * time.Millisecond, Idle: time.Hour})
	timedOut(t, "a read on a connection that sends nothing", readByte(server), start, 60*time.Millisecond)
}

func TestEnforce_AfterAnAnswerTheNextReadHasTheIdleTimeout(t *testing.T) {
	const g = 5 * time.Millisecond
	const read, idle = 30 * time.Millisecond, 150 * time.Millisecond
	_, server, client := enforcedPair(t, g, Timeouts{Read: read, Write: time.Second, Idle: idle})
	client.Write([]byte("q"))
	if err := readByte(server); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	timedOut(t, "the wait for the next request", readByte(server), start, idle)
}

func TestEnforce_ARequestsReadTimeoutRunsFromItsFirstByte(t *testing.T) {
	const g = 5 * time.Millisecond
	const read = 60 * time.Millisecond
	_, server, client := enforcedPair(t, g, Timeouts{Read: read, Write: time.Second, Idle: time.Hour})
	server.Write([]byte("a")) // an answer: the next read waits for a new request, an hour
	start := time.Now()
	client.Write([]byte("q")) // the first byte of a request, then nothing
	if err := readByte(server); err != nil {
		t.Fatal(err)
	}
	timedOut(t, "the rest of a request that does not come", readByte(server), start, read)
}

func TestEnforce_AWriteTheClientDoesNotReadTimesOut(t *testing.T) {
	const g = 5 * time.Millisecond
	_, server, _ := enforcedPair(t, g, Timeouts{Read: time.Hour, Write: 80 * time.Millisecond})
	chunk := make([]byte, 1<<20)
	start := time.Now()
	var err error
	for i := 0; i < 1000 && err == nil; i++ { // the socket buffers fill; then a write blocks
		_, err = server.Write(chunk)
	}
	timedOut(t, "a write nobody reads", err, start, 80*time.Millisecond)
}

func TestEnforce_ADeadlineSetByHandHoldsUntilCleared(t *testing.T) {
	const g = 5 * time.Millisecond
	const idle = 40 * time.Millisecond
	l, server, client := enforcedPair(t, g, Timeouts{Read: idle, Idle: idle})
	server.SetReadDeadline(time.Now().Add(time.Hour))
	waitSweptPast(t, l, time.Now().Add(3*idle))
	client.Write([]byte{1})
	if err := readByte(server); err != nil {
		t.Fatalf("a read under an hour's deadline set by hand: %v, after the idle timeout had passed", err)
	}
	// Cleared: the listener's timeouts hold again.
	server.SetReadDeadline(time.Time{})
	server.Write([]byte("a"))
	start := time.Now()
	timedOut(t, "a read after the deadline set by hand was cleared", readByte(server), start, idle)
}
