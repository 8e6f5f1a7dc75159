//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

// The fake HCA: fakeverbs.c, an in-process loopback stand-in for
// libibverbs, and its test controls. Test builds only (-tags
// pegad_fakeverbs, which the Makefile's test targets pass); a production
// build compiles nofake_cgo.go instead, and cmd/pegad's
// TestProductionBuildHasNoFakeHCA checks that the binary has none of it.

/*
#include <stdlib.h>
#include "fakeverbs.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/pegaflow/pegad/internal/ibv"
)

// FakeLibrary, as Options.Library, selects fakeverbs.c, an in-process
// loopback stand-in for libibverbs (tests of other packages): eight RoCE
// devices pegadfake0-7, one per isolated rail (10.0.N.5), pegadfakeold0
// (an older HCA on rail 0) and pegadfakeib0, an InfiniBand port that
// requires a GRH.
const FakeLibrary = "pegad-fake-libibverbs"

// fakeBuilt says this build has the fake HCA.
const fakeBuilt = true

// fakeLib is the fake's table when name is FakeLibrary, else nil.
func fakeLib(name string) *lib {
	if name != FakeLibrary {
		return nil
	}
	return &lib{c: C.pv_fake_lib(), name: "fake"}
}

// fakeMRAccess is the access flags the fake registered the MR with lkey
// with, or -1 (tests).
func fakeMRAccess(lkey uint32) int { return int(C.pv_fake_mr_access(C.uint32_t(lkey))) }

// fakeCQAcked is how many of the fake CQ's events were acked (tests).
func fakeCQAcked(c *cq) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(C.pv_fake_cq_acked(c.c))
}

// fakeChanPending is how many events wait on the fake CQ's channel (tests).
func fakeChanPending(c *cq) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(C.pv_fake_chan_pending(c.c))
}

// fakeVector is the comp_vector c was created on, by the fake (tests).
func (c *cq) fakeVector() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(C.pv_fake_cq_vector(c.c))
}

// setFakeDelay makes the fake provider's completions visible d after
// posting (tests; the setting is process-wide).
func setFakeDelay(d time.Duration) { C.pv_fake_set_delay(C.uint64_t(max(d, 0))) }

// setFakeTimerSpin sets how long before a delayed completion's moment the
// fake's timer thread spins instead of sleeping (tests; 0: sleep only).
func setFakeTimerSpin(d time.Duration) { C.pv_fake_set_timer_spin(C.uint64_t(max(d, 0))) }

// fakeSignalLateness is the mean of how late past their moment delayed
// completions signalled an armed CQ's channel since the last call (tests:
// the fake's own share of a blocked Wait's latency).
func fakeSignalLateness() time.Duration { return time.Duration(C.pv_fake_signal_lateness()) }

// fakePortEvent raises async event typ on port 1 of fake device dev and
// changes the port to match (tests); how many open contexts were told.
func fakePortEvent(dev string, typ int) int {
	cs := C.CString(dev)
	defer C.free(unsafe.Pointer(cs))
	return int(C.pv_fake_port_event(cs, C.int(typ)))
}

// fakeResetPorts undoes every fakePortEvent (tests).
func fakeResetPorts() { C.pv_fake_reset_ports() }

// FakePortEvent raises kind on port 1 of device dev of the fake library
// (FakeLibrary), changing the port to match: PortDown and PortUp set its
// state, AddressChange moves its RoCE v2 GID to a new address in a new
// /24, DeviceFatal fails every READ posted through it at once (as
// FakeNetdevDown) until FakePortState(dev, PortUp). For other packages'
// tests; it returns how many open contexts of dev were told.
func FakePortEvent(dev string, kind ibv.DeviceEventKind) int {
	typ := map[ibv.DeviceEventKind]int{ibv.PortDown: eventPortErr, ibv.PortUp: eventPortActive,
		ibv.AddressChange: eventGIDChange, ibv.DeviceFatal: eventDeviceFatal}[kind]
	if typ == 0 {
		return 0
	}
	return fakePortEvent(dev, typ)
}

// FakeResetPorts undoes every FakePortEvent (tests).
func FakeResetPorts() { fakeResetPorts() }

// FakeNetdevDown takes port 1 of fake device dev down as rxe does when its
// netdev goes down: a READ posted through it fails at once with a local QP
// operation error, before any event (raise FakePortEvent PortDown after to
// send the event). The port queries as down.
func FakeNetdevDown(dev string) {
	cs := C.CString(dev)
	defer C.free(unsafe.Pointer(cs))
	C.pv_fake_port_state(cs, 0x10000) // FK_PORT_ERR_FAST
}

// FakePortState changes port 1 of fake device dev as FakePortEvent does
// but raises no event: the moment between a port going down and the HCA
// reporting it, when READs posted through it hang (held by the fake until
// the port is back or their QP is moved to ERROR).
func FakePortState(dev string, kind ibv.DeviceEventKind) {
	typ := map[ibv.DeviceEventKind]int{ibv.PortDown: eventPortErr, ibv.PortUp: eventPortActive}[kind]
	if typ == 0 {
		return
	}
	cs := C.CString(dev)
	defer C.free(unsafe.Pointer(cs))
	C.pv_fake_port_state(cs, C.int(typ))
}
