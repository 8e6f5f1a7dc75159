//go:build linux && cgo && !noverbs

package verbs

/*
#include <errno.h>
#include "shim.h"
*/
import "C"

import (
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Values of enum ibv_event_type the loop acts on.
const (
	eventDeviceFatal = 8  // IBV_EVENT_DEVICE_FATAL
	eventPortActive  = 9  // IBV_EVENT_PORT_ACTIVE
	eventPortErr     = 10 // IBV_EVENT_PORT_ERR
	eventLIDChange   = 11 // IBV_EVENT_LID_CHANGE
	eventGIDChange   = 18 // IBV_EVENT_GID_CHANGE
)

// asyncEvents reads a device's async events (ibv_get_async_event(3)) with
// the context's async_fd in Go's netpoller: port up/down and address
// changes of the device's port become ibv.DeviceEvents, and an address
// change re-resolves the port's GID (and LID) for QPs created afterwards.
type asyncEvents struct {
	d    *device
	file *os.File // dup of ctx->async_fd
	out  chan ibv.DeviceEvent
	wg   sync.WaitGroup // the loop
	once sync.Once      // stop
}

var _ ibv.EventDevice = (*device)(nil)

// Events reports the port's asynchronous events; closed when the device
// closes. A device without an event loop returns a closed channel.
func (d *device) Events() <-chan ibv.DeviceEvent {
	if d.evs == nil {
		c := make(chan ibv.DeviceEvent)
		close(c)
		return c
	}
	return d.evs.out
}

// eventBuffer bounds the events waiting for a reader; more are dropped
// (Events' reader acts on the latest state, so losing one is harmless).
const eventBuffer = 16

// startAsyncEvents starts d's event loop; nil when the context's fd cannot
// be polled (the device works without events).
func startAsyncEvents(d *device) *asyncEvents {
	fd := C.pv_async_fd(d.ctx)
	if fd < 0 {
		return nil
	}
	e := &asyncEvents{d: d, file: os.NewFile(uintptr(fd), "ibv_async_fd"), out: make(chan ibv.DeviceEvent, eventBuffer)}
	raw, err := e.file.SyscallConn()
	if err != nil {
		e.file.Close()
		return nil
	}
	e.wg.Go(func() { e.run(raw) })
	return e
}

func (e *asyncEvents) run(raw syscall.RawConn) {
	defer close(e.out)
	for {
		var rc, typ, port C.int
		err := raw.Read(func(uintptr) bool {
			// The context lives until stop has returned: Close calls
			// stop before ibv_close_device.
			rc = C.pv_get_async_event(e.d.lib.c, e.d.ctx, &typ, &port)
			return rc != C.EAGAIN
		})
		if err != nil || rc != 0 {
			return // the file was closed (device closing), or the fd broke
		}
		e.handle(int(typ), uint8(port))
	}
}

func (e *asyncEvents) handle(typ int, port uint8) {
	st := e.d.state()
	if typ != eventDeviceFatal && port != st.port.Num {
		return // another port's; a fatal event names none
	}
	var kind ibv.DeviceEventKind
	switch typ {
	case eventDeviceFatal:
		kind = ibv.DeviceFatal
	case eventPortErr:
		kind = ibv.PortDown
	case eventPortActive:
		kind = ibv.PortUp
		e.d.reresolve()
	case eventGIDChange, eventLIDChange:
		kind = ibv.AddressChange
		e.d.reresolve()
	default:
		return
	}
	ev := ibv.DeviceEvent{Kind: kind, Info: e.d.Info()}
	if kind == ibv.DeviceFatal {
		// Said once, never again: it must not be lost behind a burst of
		// port events, so wait for room (bounded: a reader that went
		// away does not hold the loop, and stop, for long).
		select {
		case e.out <- ev:
		case <-time.After(fatalSendWait):
		}
		return
	}
	select {
	case e.out <- ev:
	default:
	}
}

// fatalSendWait bounds waiting for room for a DeviceFatal event.
const fatalSendWait = 5 * time.Second

var _ ibv.PortStater = (*device)(nil)

// PortActive queries the port d is used through (ibv_query_port(3)) and
// reports whether it is ACTIVE.
func (d *device) PortActive() (bool, error) {
	var a C.pv_portattr
	if rc := C.pv_query_port(d.lib.c, d.ctx, C.uint8_t(d.state().port.Num), &a); rc != 0 {
		return false, verbsErr("ibv_query_port", syscall.Errno(rc))
	}
	return int(a.state) == portActive, nil
}

// stop ends the loop and waits for it; safe on nil and more than once.
func (e *asyncEvents) stop() {
	if e == nil {
		return
	}
	e.once.Do(func() {
		e.file.Close() // wakes the loop; returns once its callback is done
		e.wg.Wait()
	})
}

// reresolve queries the port again and, when it is still usable, makes
// its GID, LID and MTU the ones new QPs use. A port that cannot be used now
// (down, its GID gone) keeps the last state until a later event.
func (d *device) reresolve() {
	cur := d.state()
	info, lim, c, err := d.lib.describe(d.ctx, d.name, cur.port.Num, d.opts)
	if err != nil {
		return
	}
	d.st.Store(&devState{info: info, port: portOf(c, lim, d.opts)})
}
