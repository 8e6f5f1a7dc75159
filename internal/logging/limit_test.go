package logging

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(10 * time.Second)
	l.now = func() time.Time { return now }
	step := func(d time.Duration, wantOK bool, wantSuppressed uint64) {
		t.Helper()
		now = now.Add(d)
		if ok, n := l.Allow(); ok != wantOK || n != wantSuppressed {
			t.Fatalf("Allow at +%v = %v, %d; want %v, %d", d, ok, n, wantOK, wantSuppressed)
		}
	}
	step(0, true, 0) // the first
	for i := 0; i < 5; i++ {
		step(time.Second, false, 0)
	}
	step(5*time.Second, true, 5) // 10 s after the first: with what it stands for
	step(9*time.Second, false, 0)
	step(time.Second, true, 1)
	step(time.Hour, true, 0)
}
