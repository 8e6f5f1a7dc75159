package conn

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// vendorErrDevice's CQs turn the first completion they return into a
// remote access error with vendor syndrome 0x99, as an HCA reports it.
type vendorErrDevice struct {
	ibv.Device
	done atomic.Bool
}

func (d *vendorErrDevice) CreateCQ(depth int) (ibv.CQ, error) {
	cq, err := d.Device.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	return vendorErrCQ{CQ: cq, d: d}, nil
}

func (d *vendorErrDevice) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return unwrapCQPD{pd}, nil
}

type vendorErrCQ struct {
	ibv.CQ
	d *vendorErrDevice
}

func (c vendorErrCQ) Poll(wcs []ibv.WorkCompletion) (int, error) {
	n, err := c.CQ.Poll(wcs)
	if n > 0 && c.d.done.CompareAndSwap(false, true) {
		wcs[0].Status, wcs[0].VendorErr = ibv.WCRemAccessErr, 0x99
	}
	return n, err
}

// unwrapCQPD hands the provider its own CQ.
type unwrapCQPD struct{ ibv.PD }

func (p unwrapCQPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	if w, ok := cq.(vendorErrCQ); ok {
		cq = w.CQ
	}
	return p.PD.CreateQP(cq, c)
}

// TestVendorErrInReadError (issue 27 item 7): a failed completion's
// vendor syndrome reaches the Read's error (the old StatusError dropped
// it).
func TestVendorErrInReadError(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder"})
	req := newNode(t, d, nodeOpts{id: "req",
		wrapDevice: func(dev ibv.Device) ibv.Device { return &vendorErrDevice{Device: dev} }})
	c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Read(ctxT(t, 10*time.Second), opsOf(req, hold, []span{{0, 0, 4096}}))
	var se *ibv.StatusError
	if !errors.As(err, &se) || se.Status != ibv.WCRemAccessErr || se.VendorErr != 0x99 {
		t.Fatalf("Read = %v, want a remote access StatusError with vendor_err 0x99", err)
	}
	if !strings.Contains(err.Error(), "vendor_err=0x99") {
		t.Errorf("error %q does not name the vendor syndrome", err)
	}
}
