package holder

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// fakeWindows binds nothing; it checks that each lock's windows are
// released exactly once, and while its blocks are still pinned (a READ
// through a window must never reach memory that was unpinned).
type fakeWindows struct {
	pins *fakePinner
	fail error
	// unbindErr is what every unbind returns (windows not invalidated).
	unbindErr error

	mu sync.Mutex // guards the fields below
	// bound: binds made; unbound: unbind calls; early: unbinds that
	// found the lock's blocks already unpinned; double: second unbinds.
	bound, unbound, early, double int
}

func (w *fakeWindows) BindLock(ctx context.Context, node, inc string, blocks []*pegadv1.BlockLocation) (
	[]*pegadv1.MemoryWindows, string, func() error, error) {
	if w.fail != nil {
		return nil, "", nil, w.fail
	}
	w.mu.Lock()
	w.bound++
	w.mu.Unlock()
	pinnedAtBind := w.pins.outstanding()
	var once sync.Once
	unbind := func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.unbound++
		called := true
		once.Do(func() { called = false })
		if called {
			w.double++
		}
		if w.pins.outstanding() < pinnedAtBind {
			w.early++
		}
		return w.unbindErr
	}
	return []*pegadv1.MemoryWindows{{Nic: 0, Qp: 1, Keys: []*pegadv1.WindowKey{{Base: 4096, Length: 4096, Rkey: 7}}}},
		"hs-1", unbind, nil
}

func (w *fakeWindows) check(t *testing.T, bound, unbound int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bound != bound || w.unbound != unbound || w.early != 0 || w.double != 0 {
		t.Fatalf("windows bound %d, unbound %d (%d after the unpin, %d twice); want %d bound, %d unbound",
			w.bound, w.unbound, w.early, w.double, bound, unbound)
	}
}

// TestWindowsReleasedOnceBeforeUnpin: however a lock ends (release,
// expiry, force release, shutdown, its caller gone, refused after the
// bind), its memory windows are invalidated exactly once, before its
// blocks are unpinned; the answer carries their keys; a bind that fails
// refuses the lock and pins nothing.
func TestWindowsReleasedOnceBeforeUnpin(t *testing.T) {
	query := func(t *testing.T, e *env, ctx context.Context) (*pegadv1.QueryBlocksForTransferResponse, error) {
		t.Helper()
		return e.svc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns",
			Hashes: [][]byte{[]byte("a"), []byte("b")}, Requester: req("r1", "i1")})
	}
	tests := []struct {
		name string
		end  func(t *testing.T, e *env, sid string)
	}{
		{"release", func(t *testing.T, e *env, sid string) {
			if _, err := e.svc.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: sid,
				Requester: req("r1", "i1")}); err != nil {
				t.Fatal(err)
			}
		}},
		{"expiry", func(t *testing.T, e *env, sid string) {
			if n := e.svc.locks.ExpireBefore(e.clock.Advance(e.svc.opts.LockTimeout)); n != 1 {
				t.Fatalf("expired %d", n)
			}
		}},
		{"force release", func(t *testing.T, e *env, sid string) {
			if _, err := e.svc.Locks().ForceRelease(sid, "op"); err != nil {
				t.Fatal(err)
			}
		}},
		{"shutdown", func(t *testing.T, e *env, sid string) {
			if n := e.svc.Locks().ReleaseAll("shutdown"); n != 1 {
				t.Fatalf("released %d", n)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var w *fakeWindows
			e := newEnv(t, func(o *Options) { w = &fakeWindows{}; o.Windows = w }, "a", "b")
			w.pins = e.pins
			resp, err := query(t, e, ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Windows) != 1 || resp.Windows[0].GetQp() != 1 || resp.WindowsHandshakeId != "hs-1" {
				t.Fatalf("answer's windows %v on %q", resp.Windows, resp.WindowsHandshakeId)
			}
			w.check(t, 1, 0)
			tc.end(t, e, resp.SessionId)
			w.check(t, 1, 1)
			e.pins.check(t, 0)
		})
	}
	t.Run("caller gone", func(t *testing.T) {
		var w *fakeWindows
		e := newEnv(t, func(o *Options) { w = &fakeWindows{}; o.Windows = w }, "a", "b")
		w.pins = e.pins
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := query(t, e, ctx); status.Code(err) != codes.Canceled {
			t.Fatalf("query = %v, want Canceled", err)
		}
		w.check(t, 1, 1)
		e.pins.check(t, 0)
	})
	t.Run("refused after the bind", func(t *testing.T) {
		var w *fakeWindows
		e := newEnv(t, func(o *Options) {
			w = &fakeWindows{}
			o.Windows = w
			o.Limits.SessionsPerPeer = 1
		}, "a", "b")
		w.pins = e.pins
		if _, err := query(t, e, ctxT(t)); err != nil {
			t.Fatal(err)
		}
		_, err := query(t, e, ctxT(t))
		wantCode(t, err, codes.ResourceExhausted, "")
		w.check(t, 2, 1)
		e.pins.check(t, 2) // the first lock's
	})
	t.Run("bind fails", func(t *testing.T) {
		var w *fakeWindows
		e := newEnv(t, func(o *Options) { w = &fakeWindows{fail: errors.New("no connection")}; o.Windows = w }, "a", "b")
		w.pins = e.pins
		_, err := query(t, e, ctxT(t))
		wantCode(t, err, codes.Unavailable, "memory windows")
		w.check(t, 0, 0)
		e.pins.check(t, 0)
		if e.svc.Locks().Len() != 0 {
			t.Fatal("a session was opened")
		}
	})
}
