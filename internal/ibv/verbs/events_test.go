//go:build linux && cgo && !noverbs && pegad_fakeverbs

package verbs

import (
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

func nextEvent(t *testing.T, d ibv.Device) ibv.DeviceEvent {
	t.Helper()
	select {
	case ev, ok := <-d.(ibv.EventDevice).Events():
		if !ok {
			t.Fatal("events closed")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no device event within 5s")
	}
	return ibv.DeviceEvent{}
}

// TestFakeAsyncEvents: the device reads its context's async events
// (ibv_get_async_event(3)): a GID change (an IP removed and re-added)
// re-resolves the GID for QPs created afterwards while earlier QPs keep
// theirs; port down and up are reported; Events closes with the device.
func TestFakeAsyncEvents(t *testing.T) {
	t.Cleanup(fakeResetPorts)
	p := fakeProvider()
	d, err := p.Open("pegadfake6")
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			d.Close()
		}
	})
	oldGID := ibv.GID{10: 0xff, 11: 0xff, 12: 10, 14: 6, 15: 5}
	newGID := ibv.GID{10: 0xff, 11: 0xff, 12: 10, 13: 1, 14: 6, 15: 6}
	if d.Info().GID != oldGID {
		t.Fatalf("GID before %v", d.Info().GID)
	}
	before := ibvtest.NewSide(t, d, ibvtest.DefaultCap())

	if n := fakePortEvent("pegadfake6", eventGIDChange); n != 1 {
		t.Fatalf("GID change told %d contexts, want 1", n)
	}
	if ev := nextEvent(t, d); ev.Kind != ibv.AddressChange || ev.Info.GID != newGID {
		t.Fatalf("event %v with GID %v, want address_change to %v", ev.Kind, ev.Info.GID, newGID)
	}
	if d.Info().GID != newGID {
		t.Fatalf("device GID %v after the change, want %v", d.Info().GID, newGID)
	}
	after := ibvtest.NewSide(t, d, ibvtest.DefaultCap())
	if got := after.QP.Endpoint().GID; got != newGID {
		t.Fatalf("new QP's endpoint GID %v, want the new %v", got, newGID)
	}
	if got := before.QP.Endpoint().GID; got != oldGID {
		t.Fatalf("earlier QP's endpoint GID %v, want its own %v", got, oldGID)
	}

	for _, tc := range []struct {
		typ  int
		want ibv.DeviceEventKind
	}{{eventPortErr, ibv.PortDown}, {eventPortActive, ibv.PortUp}} {
		fakePortEvent("pegadfake6", tc.typ)
		if ev := nextEvent(t, d); ev.Kind != tc.want {
			t.Fatalf("event %v, want %v", ev.Kind, tc.want)
		}
	}
	// Another device's events are not this one's.
	fakePortEvent("pegadfake5", eventPortErr)
	fakePortEvent("pegadfake5", eventPortActive)
	select {
	case ev := <-d.(ibv.EventDevice).Events():
		t.Fatalf("event %v from another device", ev.Kind)
	case <-time.After(20 * time.Millisecond):
	}

	for _, s := range []*ibvtest.Side{before, after} {
		s.QP.Destroy()
		s.CQ.Close()
		s.PD.Close()
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, ok := <-d.(ibv.EventDevice).Events(); ok {
		t.Fatal("events open after Close")
	}
}
