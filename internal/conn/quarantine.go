package conn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Memory-window invalidation fails closed. A lock's windows are
// invalidated by deallocating them (Windows.Close) before the holder
// unpins its blocks; a bind that fails is undone the same way. When that
// cannot be proved done, a window may still be valid over memory the pool
// would hand to other blocks:
//   - ibv_dealloc_mw(3) failed: the window is still allocated, and bound;
//   - a bind's completion did not come in time: the HCA may still execute
//     the IBV_WR_BIND_MW (ibv_post_send(3) only queues it), and the
//     completion still owes the holder CQ a slot.
// Then the window's QP is moved to ERROR at once: a type-2 window grants
// access only through the QP it was bound on (ibv_bind_mw(3)), a QP in
// ERROR serves no READ, and the move flushes the binds it has not executed.
// The connection the QP belongs to is invalidated (one removal from the
// Acceptor's maps, then its QPs are destroyed: docs/lessons.md L1, L4, L9), so
// the requester handshakes afresh. Owed completions are awaited once more
// after the flush; CQ slots are handed on only once none is owed. A window
// whose dealloc failed stays on its NIC (retried when the NIC is
// released), and the error says so (ErrWindowsLive): the holder then keeps
// the lock's blocks pinned for good (quarantined), counted in
// pegaflow_rdma_window_binds_total{result="quarantined"} and logged.

// ErrWindowsLive: memory windows may still be valid after their lock (or
// its refused bind) ended; the memory under them must never be reused.
// Always carried by an *InvalidationError.
var ErrWindowsLive = errors.New("conn: memory windows not invalidated")

// errBindsOwed: binds' completions did not come in time (bindTimeout);
// their QP was moved to ERROR and its connection invalidated.
var errBindsOwed = errors.New("conn: bind completions owed")

const (
	// resultQuarantined: a WindowBinds result, locks whose windows could
	// not be invalidated.
	resultQuarantined = "quarantined"
	// reasonWindows: the Invalidations reason of a connection failed
	// closed.
	reasonWindows = "window_invalidation"
)

// InvalidationError says which windows could not be invalidated: on
// which NIC and holder QP, for which requester and handshake. errors.Is
// finds ErrWindowsLive and the cause (the dealloc's error).
type InvalidationError struct {
	NIC        string
	QPN        uint32
	RemoteNode string
	Handshake  string
	Windows    int // windows still allocated
	Err        error
}

func (e *InvalidationError) Error() string {
	return fmt.Sprintf("%d memory windows on %s qp %d (requester %s, handshake %s) not invalidated: %v",
		e.Windows, e.NIC, e.QPN, e.RemoteNode, e.Handshake, e.Err)
}

func (e *InvalidationError) Unwrap() []error { return []error{ErrWindowsLive, e.Err} }

// WindowsLive reports true: the holder (holder.LiveWindows) keeps the
// blocks under these windows pinned.
func (e *InvalidationError) WindowsLive() bool { return true }

// invalidate deallocates wn's windows. Those that fail stay allocated:
// kept on their NIC, and wn's QP fails closed; the error is an
// *InvalidationError. On a dead device (DEVICE_FATAL) a failure is
// expected and harmless (its context serves nothing) and is not one.
func (acc *Acceptor) invalidate(wn *winNIC) error {
	n := wn.p.nic
	var stuck []ibv.MW
	var first error
	for _, mw := range wn.mws {
		n.windows.Dec()
		n.users.Add(-1) // a stuck one is the stuck list's (releaseStuck)
		if err := mw.Dealloc(); err != nil && !n.fatal.Load() {
			stuck = append(stuck, mw)
			if first == nil {
				first = err
			}
		}
	}
	wn.mws = nil
	if len(stuck) == 0 {
		return nil
	}
	n.win.stuckMu.Lock()
	n.win.stuck = append(n.win.stuck, stuck...)
	n.win.stuckMu.Unlock()
	err := &InvalidationError{NIC: n.info.Name, QPN: wn.p.qpn, RemoteNode: wn.a.nodeID, Handshake: wn.a.handshakeID,
		Windows: len(stuck), Err: first}
	acc.failClosed(wn, err)
	return err
}

// failClosed moves wn's QP to ERROR and invalidates its connection.
func (acc *Acceptor) failClosed(wn *winNIC, cause error) {
	wn.p.toError()
	acc.dropAccepted(wn.a)
	acc.log.Error().Err(cause).Str("nic", wn.p.nic.info.Name).Uint32("qpn", wn.p.qpn).Str("remote_node", wn.a.nodeID).
		Str("peer", wn.a.remoteAddr).Str("session", wn.a.handshakeID).
		Msg("memory windows not invalidated: qp moved to ERROR and its connection invalidated")
}

// dropAccepted removes a from the Acceptor's maps if it is still there and
// destroys it (once; whoever removed it first destroys it too, which is
// the same once).
func (acc *Acceptor) dropAccepted(a *acceptedConn) {
	acc.mu.Lock()
	if acc.accepted[a.nodeID] == a {
		delete(acc.accepted, a.nodeID)
	} else {
		delete(acc.retired, a)
	}
	acc.mu.Unlock()
	a.destroy(reasonWindows)
}

// flushBinds handles owed bind completions of wn's QP (they did not come
// before cause): the QP is moved to ERROR, which flushes the binds it has
// not executed, and they are awaited once more; the connection is then
// invalidated, its QP in ERROR being of no more use. Completions still
// owed after that are the destroyed QP's, which no HCA writes once
// ibv_destroy_qp returns: the CQ is drained of those written before.
// When it returns nothing is owed, so the caller's CQ slots are free.
func (acc *Acceptor) flushBinds(wn *winNIC, ch chan ibv.WorkCompletion, owed int, cause error) error {
	n := wn.p.nic
	wn.p.toError()
	ctx, cancel := context.WithTimeout(context.Background(), bindFlushTimeout)
	defer cancel()
	got, _ := acc.awaitBinds(ctx, n, ch, owed, nil)
	acc.dropAccepted(wn.a)
	if got < owed {
		_ = n.win.poll(n.holderCQNow())
	}
	acc.log.Error().Err(cause).Str("nic", n.info.Name).Uint32("qpn", wn.p.qpn).Str("remote_node", wn.a.nodeID).
		Str("session", wn.a.handshakeID).Int("owed", owed).Int("flushed", got).
		Msg("memory window binds timed out: qp moved to ERROR and its connection invalidated")
	return fmt.Errorf("%w: %d on %s qp %d: %w", errBindsOwed, owed, n.info.Name, wn.p.qpn, cause)
}

// bindFailedClosed ends a lock whose binds failed closed on some NIC: the
// windows bound on the others are invalidated too (their connection is
// gone), and the error wraps ErrNoWindows, and ErrWindowsLive when a
// window could not be deallocated.
func (acc *Acceptor) bindFailedClosed(w *Windows, node string, errs []error) error {
	for _, wn := range w.nics {
		if err := acc.invalidate(wn); err != nil {
			errs = append(errs, err)
		}
	}
	var ie *InvalidationError
	result := resultError
	if err := errors.Join(errs...); errors.As(err, &ie) {
		result = resultQuarantined
	}
	acc.met.WindowBinds.WithLabelValues(result).Inc()
	return fmt.Errorf("%w: requester %s: binds failed closed: %w", ErrNoWindows, node, errors.Join(errs...))
}

// releaseStuck retries the dealloc of n's stuck windows when n is
// released (its QPs are gone): the MR and PD are released after them.
func (s *NICs) releaseStuck(n *localNIC) {
	n.win.stuckMu.Lock()
	stuck := n.win.stuck
	n.win.stuck = nil
	n.win.stuckMu.Unlock()
	var failed []string
	for _, mw := range stuck {
		if err := mw.Dealloc(); err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 && !n.fatal.Load() {
		s.log.Error().Str("nic", n.info.Name).Int("windows", len(failed)).Str("errors", strings.Join(failed, "; ")).
			Msg("memory windows still not deallocated at release")
	}
}
