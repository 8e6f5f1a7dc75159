//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

/*
#include "fakeverbs.h"
*/
import "C"

import (
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Test controls of the fake HCA's memory windows (FakeLibrary; fakemw.h
// has the model). They change nothing but the fake: a real device, and
// every production type, never read them. Process-wide, like the fake.

// FakeNever is a FakeMWFaults.BindDelay: the bind never executes on its
// own; only moving its QP to ERROR (a flush) or destroying it ends it.
const FakeNever time.Duration = -1

// FakeMWFaults are faults of the fake HCA's memory windows. The zero
// value is the fake without faults.
type FakeMWFaults struct {
	// BindDelay: an IBV_WR_BIND_MW the HCA has not processed yet. It stays
	// in the send queue and executes, making the window valid, this long
	// after it was posted, then completes (FakeNever: never on its own);
	// moving the QP to ERROR first flushes it (IBV_WC_WR_FLUSH_ERR,
	// nothing bound), as ibv_post_send(3) and ibv_modify_qp(3) allow.
	BindDelay time.Duration
	// BindStatus, when not success, fails every bind with it (e.g.
	// ibv.WCMWBindErr, ibv_bind_mw(3)), binding nothing.
	BindStatus ibv.WCStatus
	// DeallocErr makes ibv_dealloc_mw(3) return it: the window stays
	// allocated and bound, and READs through it still work.
	DeallocErr syscall.Errno
}

// fakeMWMu serializes SetFakeMWFaults and its restores.
var fakeMWMu sync.Mutex // guards the fake's fault settings (set as a whole)

// SetFakeMWFaults sets f and returns a function that restores the faults
// it replaced (tests: t.Cleanup(verbs.SetFakeMWFaults(f))).
func SetFakeMWFaults(f FakeMWFaults) (restore func()) {
	fakeMWMu.Lock()
	defer fakeMWMu.Unlock()
	prev := fakeMWFaults
	setFakeMWFaultsLocked(f)
	return func() {
		fakeMWMu.Lock()
		defer fakeMWMu.Unlock()
		setFakeMWFaultsLocked(prev)
	}
}

// fakeMWFaults is what the fake was last given (guarded by fakeMWMu).
var fakeMWFaults FakeMWFaults

func setFakeMWFaultsLocked(f FakeMWFaults) {
	fakeMWFaults = f
	delay := uint64(max(f.BindDelay, 0))
	if f.BindDelay < 0 {
		delay = math.MaxUint64
	}
	C.pv_fake_mw_faults(C.uint64_t(delay), C.int(f.BindStatus), C.int(f.DeallocErr))
}

// FakeMemoryWindows counts the fake's windows that are bound, and of
// those the ones a peer's READ can use now (their QP is in RTR or RTS):
// a window bound on a QP in ERROR or destroyed grants nothing.
func FakeMemoryWindows() (bound, usable int) {
	var b, u C.int
	C.pv_fake_mws(&b, &u)
	return int(b), int(u)
}
