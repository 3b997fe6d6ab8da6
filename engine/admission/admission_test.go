package admission

import (
	"testing"
	"time"
)

func TestAdmission_InFlightCap(t *testing.T) {
	a := NewGate(0, 0, 2)
	now := time.Now()
	ok1, _ := a.Admit(0, now)
	ok2, _ := a.Admit(1, now)
	ok3, retry := a.Admit(2, now)
	if !ok1 || !ok2 || ok3 || retry <= 0 {
		t.Fatalf("cap 2: admitted %v %v %v (retry %s)", ok1, ok2, ok3, retry)
	}
	a.Done()
	if ok, _ := a.Admit(3, now); !ok {
		t.Fatal("a slot freed by done was not given out")
	}
	if got := a.inFlight.Load(); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
}

func TestAdmission_TokenBucketRefills(t *testing.T) {
	a := NewGate(80, 8, 0) // 8 shards: 10/s and a burst of 1 each
	now := time.Now()
	if ok, _ := a.Admit(5, now); !ok {
		t.Fatal("first deduct refused")
	}
	ok, retry := a.Admit(5, now)
	if ok || retry != 100*time.Millisecond {
		t.Fatalf("second deduct in the same instant: admitted %v, retry %s (want refused, 100ms)", ok, retry)
	}
	if ok, _ := a.Admit(6, now); !ok {
		t.Fatal("another shard's token was not there")
	}
	if ok, _ := a.Admit(5, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("token not refilled after its interval")
	}
}
