package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingExpirer records calls and the time it was given.
type countingExpirer struct {
	calls atomic.Int64
	last  atomic.Int64 // unix nanos of the last now
}

func (c *countingExpirer) ExpireBefore(now time.Time) int {
	c.calls.Add(1)
	c.last.Store(now.UnixNano())
	return 0
}

func TestSweepUntilCanceled(t *testing.T) {
	tests := []struct {
		name     string
		interval time.Duration
	}{
		{"short interval", 5 * time.Millisecond},
		{"non-positive interval takes the default", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &countingExpirer{}
			fixed := time.Unix(1_700_000_000, 42)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				Sweep(ctx, tc.interval, e, func() time.Time { return fixed })
			}()
			want := int64(3)
			wait := 2 * time.Second
			if tc.interval <= 0 {
				want, wait = 1, 3*DefaultSweepInterval
			}
			deadline := time.Now().Add(wait)
			for e.calls.Load() < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			cancel()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatal("Sweep did not return after cancel")
			}
			if got := e.calls.Load(); got < want {
				t.Fatalf("ExpireBefore called %d times, want >= %d", got, want)
			}
			if got := e.last.Load(); got != fixed.UnixNano() {
				t.Fatalf("ExpireBefore got now=%d, want the injected clock %d", got, fixed.UnixNano())
			}
			// No call after Sweep returned.
			n := e.calls.Load()
			time.Sleep(20 * time.Millisecond)
			if e.calls.Load() != n {
				t.Fatal("ExpireBefore called after Sweep returned")
			}
		})
	}
}

func TestSweepReturnsOnCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e := &countingExpirer{}
	Sweep(ctx, time.Hour, e, nil)
	if e.calls.Load() != 0 {
		t.Fatalf("ExpireBefore called %d times on a canceled context", e.calls.Load())
	}
}

// TestExpirersGiveEachTheSameTime: one sweep of several tables gives each
// the same time and sums what they ended.
func TestExpirersGiveEachTheSameTime(t *testing.T) {
	a, b := &countingExpirer{}, &countingExpirer{}
	ta, ca, _ := newTable(t, time.Second, 0)
	o := ta.NewOwner()
	_, _ = o.Open(1)
	_, _ = o.Open(2)
	now := ca.now().Add(time.Second)
	if n := (Expirers{a, ta, b}).ExpireBefore(now); n != 2 {
		t.Fatalf("Expirers ended %d, want the table's 2", n)
	}
	for _, e := range []*countingExpirer{a, b} {
		if e.calls.Load() != 1 || e.last.Load() != now.UnixNano() {
			t.Fatalf("expirer called %d times with %d, want once with %d", e.calls.Load(), e.last.Load(), now.UnixNano())
		}
	}
}
