//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// The fake's memory-window faults (FakeMWFaults), which other packages'
// tests use to see what the holder does when an HCA is slow or failing.

// allocMW is a fresh window of e's holder PD, deallocated at the end.
func (e *mwEnv) allocMW(t *testing.T) ibv.MW {
	t.Helper()
	w, err := e.h.PD.(ibv.MWPD).AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Dealloc() })
	return w
}

func (e *mwEnv) postBind(t *testing.T, w ibv.MW) uint32 {
	t.Helper()
	rkey, err := e.h.QP.(ibv.MWQP).PostBindMW(w, e.hmr, e.hmr.Addr()+e.winOff, e.winLength, ibv.AccessRemoteRead, 200, true)
	if err != nil {
		t.Fatal(err)
	}
	return rkey
}

// pollNow is what e's holder CQ has now, without waiting.
func (e *mwEnv) pollNow(t *testing.T) []ibv.WorkCompletion {
	t.Helper()
	wcs := make([]ibv.WorkCompletion, 8)
	n, err := e.h.CQ.Poll(wcs)
	if err != nil {
		t.Fatal(err)
	}
	return wcs[:n]
}

// TestFakeMWDeallocFails: a failed ibv_dealloc_mw returns its errno and
// leaves the window bound and usable; moving its QP to ERROR makes it
// unusable (a READ through it fails), and a retried dealloc frees it.
func TestFakeMWDeallocFails(t *testing.T) {
	e := newMWEnv(t, fakeProvider(), "pegadfake0")
	restore := SetFakeMWFaults(FakeMWFaults{DeallocErr: syscall.EIO})
	t.Cleanup(restore)
	bound0, usable0 := FakeMemoryWindows()
	var ve *Error
	if err := e.w.Dealloc(); !errors.As(err, &ve) || ve.Errno != syscall.EIO {
		t.Fatalf("Dealloc = %v, want ibv_dealloc_mw's EIO", err)
	}
	if st := e.read(t, e.a, e.amr, e.rkey, 0, 4096); st != ibv.WCSuccess {
		t.Fatalf("READ through a window whose dealloc failed: %s, want success (the window stays)", st)
	}
	if bound, usable := FakeMemoryWindows(); bound != bound0 || usable != usable0 {
		t.Fatalf("windows bound/usable %d/%d after a failed dealloc, want %d/%d", bound, usable, bound0, usable0)
	}
	if err := e.h.QP.ToError(); err != nil {
		t.Fatal(err)
	}
	if _, usable := FakeMemoryWindows(); usable != usable0-1 {
		t.Fatalf("usable windows %d after their QP went to ERROR, want %d", usable, usable0-1)
	}
	if st := e.read(t, e.a, e.amr, e.rkey, 0, 4096); st == ibv.WCSuccess {
		t.Fatal("READ through a window whose QP is in ERROR succeeded")
	}
	restore()
	if err := e.w.Dealloc(); err != nil {
		t.Fatalf("dealloc retried without the fault: %v", err)
	}
	if bound, _ := FakeMemoryWindows(); bound != bound0-1 {
		t.Fatalf("bound windows %d after the retried dealloc, want %d", bound, bound0-1)
	}
}

// TestFakeMWDelayedBind: a delayed bind is queued, not executed, at post:
// no completion and no window until its moment; then it binds and
// completes. A flush (QP to ERROR) ends a bind that never executes, with
// nothing bound; a bind whose window was deallocated meanwhile fails.
func TestFakeMWDelayedBind(t *testing.T) {
	const delay = 80 * time.Millisecond
	t.Run("executes at its moment", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		w := e.allocMW(t)
		t.Cleanup(SetFakeMWFaults(FakeMWFaults{BindDelay: delay}))
		bound0, _ := FakeMemoryWindows()
		e.postBind(t, w)
		if wcs := e.pollNow(t); len(wcs) != 0 {
			t.Fatalf("a delayed bind completed at post: %+v", wcs)
		}
		if bound, _ := FakeMemoryWindows(); bound != bound0 {
			t.Fatalf("%d windows bound at post, want %d", bound, bound0)
		}
		time.Sleep(delay + 20*time.Millisecond)
		if bound, _ := FakeMemoryWindows(); bound != bound0+1 {
			t.Fatalf("%d windows bound after the delay, want %d", bound, bound0+1)
		}
		if wcs := e.pollNow(t); len(wcs) != 1 || wcs[0].Status != ibv.WCSuccess || wcs[0].ID != 200 {
			t.Fatalf("completions after the delay %+v, want the bind's success", wcs)
		}
	})
	t.Run("flushed before it executes", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		w := e.allocMW(t)
		t.Cleanup(SetFakeMWFaults(FakeMWFaults{BindDelay: FakeNever}))
		bound0, _ := FakeMemoryWindows()
		rkey := e.postBind(t, w)
		time.Sleep(delay)
		if wcs := e.pollNow(t); len(wcs) != 0 {
			t.Fatalf("a bind that never executes completed: %+v", wcs)
		}
		if err := e.h.QP.ToError(); err != nil {
			t.Fatal(err)
		}
		if wcs := e.pollNow(t); len(wcs) != 1 || wcs[0].Status != ibv.WCWRFlushErr {
			t.Fatalf("completions after the flush %+v, want one WR_FLUSH_ERR", wcs)
		}
		if bound, _ := FakeMemoryWindows(); bound != bound0 {
			t.Fatalf("%d windows bound after a flushed bind, want %d", bound, bound0)
		}
		if st := e.read(t, e.a, e.amr, rkey, 0, 4096); st == ibv.WCSuccess {
			t.Fatal("READ through a flushed bind's key succeeded")
		}
	})
	t.Run("window gone before it executes", func(t *testing.T) {
		e := newMWEnv(t, fakeProvider(), "pegadfake0")
		w, err := e.h.PD.(ibv.MWPD).AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(SetFakeMWFaults(FakeMWFaults{BindDelay: delay}))
		e.postBind(t, w)
		if err := w.Dealloc(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay + 20*time.Millisecond)
		if wcs := e.pollNow(t); len(wcs) != 1 || wcs[0].Status != ibv.WCMWBindErr {
			t.Fatalf("completions %+v, want one MW_BIND_ERR", wcs)
		}
	})
}

// TestFakeMWBindStatus: a bind fault completes every bind with its status,
// binding nothing.
func TestFakeMWBindStatus(t *testing.T) {
	e := newMWEnv(t, fakeProvider(), "pegadfake0")
	w := e.allocMW(t)
	t.Cleanup(SetFakeMWFaults(FakeMWFaults{BindStatus: ibv.WCMWBindErr}))
	bound0, _ := FakeMemoryWindows()
	e.postBind(t, w)
	if wcs := e.pollNow(t); len(wcs) != 1 || wcs[0].Status != ibv.WCMWBindErr {
		t.Fatalf("completions %+v, want one MW_BIND_ERR", wcs)
	}
	if bound, _ := FakeMemoryWindows(); bound != bound0 {
		t.Fatalf("%d windows bound after a failed bind, want %d", bound, bound0)
	}
}
