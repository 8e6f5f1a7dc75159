//go:build linux && cgo && !noverbs && pegad_fakeverbs

package conn

import (
	"bytes"
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
)

// Issue 33 item 6: memory-window invalidation fails closed. These tests
// give the fake HCA faults (verbs.SetFakeMWFaults) that a real one shows
// only when it is slow or failing.

// fakeFaultsOnly skips where the windows tests run on a real device: the
// faults are the fake's.
func fakeFaultsOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("PEGAD_TEST_MW_DEVICE") != "" {
		t.Skip("HCA faults are the fake's (PEGAD_TEST_MW_DEVICE is set)")
	}
}

// holderConnOf is the holder's accepted connection of the requester.
func holderConnOf(h *fakeNode) *acceptedConn {
	h.acc.mu.Lock()
	defer h.acc.mu.Unlock()
	return h.acc.accepted["requester"]
}

// checkFailedClosed: every QP of a is in ERROR or destroyed, a is no
// longer the requester's connection, and counted as invalidated.
func checkFailedClosed(t *testing.T, h *fakeNode, a *acceptedConn) {
	t.Helper()
	for _, qs := range a.nics {
		for _, p := range qs {
			p.mu.Lock()
			destroyed := p.destroyed
			p.mu.Unlock()
			if st := p.qp.State(); !destroyed && st != ibv.QPSError {
				t.Errorf("holder qp %d in %v, want ERROR (or destroyed)", p.qpn, st)
			}
		}
	}
	if holderConnOf(h) == a {
		t.Error("the holder's connection of the requester was not invalidated")
	}
	if got := testutil.ToFloat64(h.met.Invalidations.WithLabelValues(reasonWindows)); got != 1 {
		t.Errorf("pegaflow_rdma_invalidations_total{reason=%q} = %v, want 1", reasonWindows, got)
	}
}

// TestFakeVerbsWindowsDeallocFailsClosed is issue 33 item 6 (a): a lock's
// windows whose ibv_dealloc_mw fails are not taken as invalidated. Close
// says so (ErrWindowsLive: the holder keeps the blocks pinned), the
// window's QP is moved to ERROR and its connection invalidated, and a
// READ through the old window key fails and reads nothing. On the old
// code the failure was logged and the window kept working: the READ read
// the block after its lock had ended.
func TestFakeVerbsWindowsDeallocFailsClosed(t *testing.T) {
	fakeFaultsOnly(t)
	const blk = 64 << 10
	holder, req, _ := windowNodes(t, 16*blk)
	hb, rb := base(holder.mem), base(req.mem)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := req.dial.Get(ctx, "holder:1")
	if err != nil {
		t.Fatal(err)
	}
	a := holderConnOf(holder)
	w, err := holder.acc.BindWindows(ctx, "requester", "requester-1", []Extent{{Addr: hb + 2*blk, Len: blk}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGrant(w.Proto())
	if err != nil {
		t.Fatal(err)
	}
	read := func() error {
		clear(req.mem[:blk])
		return c.Read(ctx, []ReadOp{{LocalAddr: rb, RemoteAddr: hb + 2*blk, Len: blk, NUMA: -1, Grant: g}})
	}
	if err := read(); err != nil {
		t.Fatalf("read under the lock: %v", err)
	}
	t.Cleanup(verbs.SetFakeMWFaults(verbs.FakeMWFaults{DeallocErr: syscall.EIO})) // restored before the managers close
	_, usable0 := verbs.FakeMemoryWindows()

	err = w.Close()
	var ie *InvalidationError
	if !errors.As(err, &ie) || !errors.Is(err, ErrWindowsLive) || !errors.Is(err, syscall.EIO) || ie.Windows != 1 ||
		ie.RemoteNode != "requester" {
		t.Errorf("Close = %v, want an InvalidationError of 1 window wrapping ErrWindowsLive and EIO", err)
	}
	if err2 := w.Close(); err2 != err {
		t.Errorf("second Close = %v, want the first's %v", err2, err)
	}
	if err := read(); err == nil {
		t.Error("a READ through the old window key read the block after its lock ended")
	} else if !bytes.Equal(req.mem[:blk], make([]byte, blk)) {
		t.Error("bytes landed from a refused READ")
	}
	if _, usable := verbs.FakeMemoryWindows(); usable != usable0-1 {
		t.Errorf("%d windows usable after Close, want %d: the window whose dealloc failed still serves READs", usable, usable0-1)
	}
	checkFailedClosed(t, holder, a)
	if got := testutil.ToFloat64(holder.met.WindowBinds.WithLabelValues(resultQuarantined)); got != 1 {
		t.Errorf("pegaflow_rdma_window_binds_total{result=%q} = %v, want 1", resultQuarantined, got)
	}
	// The requester (whose READ failed) handshakes afresh and locks again.
	req.dial.Invalidate(c, err)
	if _, err := req.dial.Get(ctx, "holder:1"); err != nil {
		t.Fatal(err)
	}
	if a2 := holderConnOf(holder); a2 == nil || a2 == a {
		t.Fatal("no new connection after the requester reconnected")
	}
	w2, err := holder.acc.BindWindows(ctx, "requester", "requester-1", []Extent{{Addr: hb + 4*blk, Len: blk}})
	if err != nil {
		t.Fatalf("bind after the reconnect: %v", err)
	}
	if err := w2.Close(); !errors.Is(err, ErrWindowsLive) {
		t.Errorf("Close with the fault still set = %v, want ErrWindowsLive", err)
	}
}

// shortBindTimeouts shortens bindTimeout and bindFlushTimeout for a test.
func shortBindTimeouts(t *testing.T, d time.Duration) {
	t.Helper()
	bt, ft := bindTimeout, bindFlushTimeout
	bindTimeout, bindFlushTimeout = d, 10*d
	t.Cleanup(func() { bindTimeout, bindFlushTimeout = bt, ft })
}

// TestFakeVerbsWindowsBindTimeoutFailsClosed is issue 33 item 6 (b): a
// bind whose completion does not come before bindTimeout may still be
// executed by the HCA. Its CQ slot is not handed on while the completion
// is owed, its QP is moved to ERROR (flushing it) and its connection
// invalidated, and the lock is refused; where its window could not be
// deallocated either, the refusal says ErrWindowsLive (the holder keeps
// the blocks pinned). No window becomes usable after the refusal. On the
// old code the slots were released with the completion owed, which came
// later; the QP stayed in RTS; and with a failed dealloc the late bind
// made the window usable over memory already unpinned.
func TestFakeVerbsWindowsBindTimeoutFailsClosed(t *testing.T) {
	fakeFaultsOnly(t)
	const delay = 300 * time.Millisecond
	for _, tc := range []struct {
		name       string
		deallocErr syscall.Errno
	}{
		{"dealloc works", 0},
		{"dealloc fails", syscall.EIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shortBindTimeouts(t, 50*time.Millisecond)
			holder, req, _ := windowNodes(t, 1<<20)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := req.dial.Get(ctx, "holder:1"); err != nil {
				t.Fatal(err)
			}
			a := holderConnOf(holder)
			n := holder.nics.curNICs()[0]
			t.Cleanup(verbs.SetFakeMWFaults(verbs.FakeMWFaults{BindDelay: delay, DeallocErr: tc.deallocErr}))
			_, usable0 := verbs.FakeMemoryWindows()
			began := time.Now()
			w, err := holder.acc.BindWindows(ctx, "requester", "requester-1", []Extent{{Addr: base(holder.mem), Len: 4096}})
			if err == nil {
				_ = w.Close()
				t.Fatalf("BindWindows succeeded although its bind did not complete within %v", bindTimeout)
			}
			returned := time.Since(began)
			live := errors.Is(err, ErrWindowsLive)
			if !errors.Is(err, ErrNoWindows) || live != (tc.deallocErr != 0) {
				t.Errorf("BindWindows = %v; want ErrNoWindows, and ErrWindowsLive %v", err, tc.deallocErr != 0)
			}
			if !n.win.slots.TryAcquire(holdCQDepthWindows) {
				t.Error("CQ slots still taken after BindWindows returned")
			} else {
				n.win.slots.Release(holdCQDepthWindows)
			}
			checkFailedClosed(t, holder, a)
			time.Sleep(delay - returned + 100*time.Millisecond) // past the bind's moment
			wcs := make([]ibv.WorkCompletion, 4)
			if k, _ := n.holderCQNow().Poll(wcs); k > 0 {
				t.Errorf("%d bind completions came after BindWindows returned (%+v): their CQ slots were handed on while owed", k, wcs[:k])
			}
			if _, usable := verbs.FakeMemoryWindows(); usable != usable0 {
				t.Errorf("%d windows usable after the refused lock's bind ran, want %d", usable, usable0)
			}
		})
	}
}
