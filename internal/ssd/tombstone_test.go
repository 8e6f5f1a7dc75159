package ssd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSSDDeleteSurvivesRestart: a block deleted from the tier (Forget, as
// store.Delete calls it) or dropped after failing its checksum stays gone
// after a restart, clean or kill -9 (no Close: the writers' queue is
// drained, then the files are simply reopened), on one path or several;
// a block put again after its delete comes back with the new copy.
func TestSSDDeleteSurvivesRestart(t *testing.T) {
	for _, tc := range []struct {
		npaths int
		clean  bool
	}{{1, true}, {1, false}, {2, true}, {2, false}} {
		t.Run(fmt.Sprintf("%dpaths/clean=%v", tc.npaths, tc.clean), func(t *testing.T) {
			e := newEnv(t, tc.npaths, 8<<20, 1<<20)
			tr := e.open(t)
			const n = 32 << 10
			for i := 0; i < 10; i++ {
				spill(t, tr, i, n)
			}
			for _, i := range []int{2, 5, 7} {
				if !tr.Forget(key(i)) {
					t.Fatalf("forget %d: not held", i)
				}
			}
			spill(t, tr, 7, n) // deleted, then evicted again: the new copy counts
			// Block 3 fails its checksum: dropped at the read.
			l3 := func() loc { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.index[key(3)] }()
			flip(t, l3.dev.path, l3.off+int64(l3.hdrLen)+100)
			if _, _, err := loadCopy(tr, key(3)); !errors.Is(err, ErrChecksum) {
				t.Fatalf("corrupted block 3 loaded: %v", err)
			}
			waitIdle(t, tr)
			if tc.clean {
				if err := tr.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				kill9(t, tr)
			}
			checks := testutil.ToFloat64(e.m.ChecksumFailures)
			tr = e.open(t)
			for i := 0; i < 10; i++ {
				gone := i == 2 || i == 3 || i == 5
				if tr.Has(key(i)) == gone {
					t.Errorf("block %d: held %v after restart, want %v", i, tr.Has(key(i)), !gone)
				}
				if !gone {
					mustLoad(t, tr, i, n)
				}
			}
			if got := testutil.ToFloat64(e.m.ChecksumFailures); got != checks {
				t.Errorf("checksum failures %v after restart, want %v (the dropped block was found again)", got, checks)
			}
			if st := tr.Stats(); st.Blocks != 7 {
				t.Errorf("%d blocks after restart, want 7", st.Blocks)
			}
		})
	}
}

// kill9 leaves tr as a killed process would: what was written stays in
// the files, nothing is flushed or closed in order. The writers are
// stopped (their queue is empty) and the files closed so that the test
// can reopen them; no record is added.
func kill9(t *testing.T, tr *Tier) {
	t.Helper()
	tr.mu.Lock()
	tr.closed = true
	for _, d := range tr.devs {
		close(d.queue)
	}
	tr.mu.Unlock()
	tr.wg.Wait()
	for _, d := range tr.devs {
		_ = d.f.Close()
	}
}
