package requester

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/conn"
)

// TestPrefetchInLockWindows: a prefetch of more than the holder's per-peer
// pin cap is fetched in windows that fit it. A holder that states its cap
// windows the query itself, and the next window is locked while the one
// before it is read; an older holder that states nothing refuses at the
// limit and is asked for fewer hashes. Every block arrives, every session
// is released exactly once.
func TestPrefetchInLockWindows(t *testing.T) {
	const blocks, blockBytes = 40, 16 << 10 // 640 KiB
	tests := []struct {
		name    string
		windows bool
		// wantAsked: the hashes the first queries named, in order; every
		// later one names at most the last of them.
		wantAsked []int
		wantLive  int // most sessions live at once
	}{
		// Windows of cap/2 = 128 KiB = 8 blocks: 5 windows, two live at once.
		{name: "holder states its cap", windows: true, wantAsked: []int{40, 32, 24, 16, 8}, wantLive: 2},
		// 40 and 20 blocks are refused; 10 fit. A next 10 asked while the
		// first 10 are held is refused too, and asked again once they are
		// released.
		{name: "older holder", windows: false, wantAsked: []int{40, 20, 10}, wantLive: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t)
			hs.h.pinCap, hs.h.windows = 256<<10, tc.windows
			var reads atomic.Int64
			hs.cs.r.read = func(ctx context.Context, ops []conn.ReadOp) error {
				n := int(reads.Add(1))
				if !tc.windows {
					return nil
				}
				// The sessions list shows the fetch's bytes so far: the
				// windows locked before this one and this one (8 blocks each).
				if in := hs.e.InFlight(); len(in) != 1 || in[0].Bytes != uint64(n*8*blockBytes) || in[0].Blocks != n*8 {
					return fmt.Errorf("window %d: in flight %+v, want %d blocks, %d bytes", n, in, n*8, n*8*blockBytes)
				}
				if n == 5 {
					return nil
				}
				// Read window n only once window n+1 was asked for: the
				// pipeline locks it while this one is read.
				deadline := time.Now().Add(5 * time.Second)
				for {
					hs.h.mu.Lock()
					asked := len(hs.h.asked)
					hs.h.mu.Unlock()
					if asked > n {
						return nil
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("window %d read before window %d was locked", n, n+1)
					}
					time.Sleep(time.Millisecond)
				}
			}
			res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("w", blocks))
			if err != nil {
				t.Fatal(err)
			}
			checkAllFetched(t, res, blocks*blockBytes)
			hs.h.checkReleasedOnce(t)
			hs.st.check(t)
			hs.h.mu.Lock()
			defer hs.h.mu.Unlock()
			asked := hs.h.asked
			if len(asked) < len(tc.wantAsked) || fmt.Sprint(asked[:len(tc.wantAsked)]) != fmt.Sprint(tc.wantAsked) {
				t.Fatalf("queries named %v hashes, want %v first", asked, tc.wantAsked)
			}
			for _, n := range asked[len(tc.wantAsked):] {
				if last := tc.wantAsked[len(tc.wantAsked)-1]; n > last {
					t.Errorf("queries named %v hashes: one after the first %d names more than %d", asked, len(tc.wantAsked), last)
				}
			}
			if hs.h.maxLive != tc.wantLive {
				t.Errorf("at most %d sessions live at once, want %d", hs.h.maxLive, tc.wantLive)
			}
		})
	}
}

// TestFailedWindowReleasesTheNext: when a window's read fails, the window
// the pipeline locked behind it is released too, and the blocks of the
// windows already indexed stay fetched.
func TestFailedWindowReleasesTheNext(t *testing.T) {
	hs := newHarness(t)
	hs.h.pinCap, hs.h.windows = 256<<10, true
	var reads atomic.Int64
	hs.cs.r.read = func(ctx context.Context, ops []conn.ReadOp) error {
		if reads.Add(1) < 2 {
			return nil
		}
		// Fail window 2 once window 3 is locked.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			hs.h.mu.Lock()
			asked := len(hs.h.asked)
			hs.h.mu.Unlock()
			if asked >= 3 {
				break
			}
		}
		return errLocalTest
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("f", 40))
	if err == nil {
		t.Fatal("prefetch succeeded; window 2's read failed")
	}
	for i, b := range res.Blocks {
		want := StatusFailed
		if i < 8 {
			want = StatusFetched // window 1
		}
		if b.Status != want {
			t.Errorf("block %d: %v, want %v", i, b.Status, want)
		}
	}
	hs.h.checkReleasedOnce(t)
	if s, _, _ := hs.h.counts(); s != 3 {
		t.Errorf("%d sessions, want 3 (window 3 locked behind the failed one)", s)
	}
	hs.st.check(t)
}

var errLocalTest = fmt.Errorf("test: read failed")

// TestNextWindowRenewedDuringSlowRead (a review finding: docs/lessons.md,
// "Issue 23 defect 2"): the window locked
// behind a slow read is renewed from its lock on, not only once its own
// transfer starts, so its lock does not lapse while the window before it
// is read. On the old code its renewer started only at its transfer: no
// renewal of the second session during a first read of 3 lock timeouts.
func TestNextWindowRenewedDuringSlowRead(t *testing.T) {
	const blocks, blockBytes = 16, 16 << 10 // two windows of 8
	const lockTimeout = 150 * time.Millisecond
	hs := newHarness(t)
	hs.h.pinCap, hs.h.windows, hs.h.lockTimeout = 256<<10, true, lockTimeout
	var reads atomic.Int64
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		if reads.Add(1) != 1 {
			return nil
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			hs.h.mu.Lock()
			n := len(hs.h.sessions)
			hs.h.mu.Unlock()
			if n == 2 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("second window never locked")
			}
			time.Sleep(time.Millisecond)
		}
		select {
		case <-time.After(3 * lockTimeout):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		hs.h.mu.Lock()
		defer hs.h.mu.Unlock()
		for sid, s := range hs.h.sessions {
			if s.renewals == 0 {
				return fmt.Errorf("session %s (query %d) not renewed during a read of 3 lock timeouts", sid, s.query)
			}
		}
		return nil
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("slow", blocks))
	if err != nil {
		t.Fatal(err)
	}
	checkAllFetched(t, res, blocks*blockBytes)
	hs.h.checkReleasedOnce(t)
	hs.st.check(t)
}

// checkAllFetched fails t unless every block of res was fetched and the
// bytes add up to want.
func checkAllFetched(t *testing.T, res *Result, want uint64) {
	t.Helper()
	for i, b := range res.Blocks {
		if b.Status != StatusFetched {
			t.Fatalf("block %d: %v %v", i, b.Status, b.Err)
		}
	}
	if res.Bytes != want {
		t.Fatalf("bytes %d, want %d", res.Bytes, want)
	}
}
