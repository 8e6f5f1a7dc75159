package conn

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// cqCounter counts the CQs a device creates.
type cqCounter struct {
	ibv.Device
	n *atomic.Int32
}

func (c cqCounter) CreateCQ(depth int) (ibv.CQ, error) {
	c.n.Add(1)
	return c.Device.CreateCQ(depth)
}

// TestHolderSharesOneCQPerNIC (issue 27 item 7): a holder posts nothing,
// so the CQs of its QPs never get a completion and nobody polls them. It
// created one per accepted QP (12 here: this test fails on that code);
// now its QPs share one per NIC, kept across connections and closed with
// the manager, while a requester's QPs keep one each.
func TestHolderSharesOneCQPerNIC(t *testing.T) {
	d := newDialers(t)
	var holdCQs, reqCQs atomic.Int32
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 3,
		wrapDevice: func(dev ibv.Device) ibv.Device { return cqCounter{dev, &holdCQs} }})
	hold.fillRandom(3)
	for i, id := range []string{"req-a", "req-b"} {
		req := newNode(t, d, nodeOpts{id: id, nics: 2, qps: 3,
			wrapDevice: func(dev ibv.Device) ibv.Device { return cqCounter{dev, &reqCQs} }})
		c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
		if err != nil {
			t.Fatal(err)
		}
		spans := []span{{0, 64 << 10, 64 << 10}, {128 << 10, 0, 32 << 10}}
		if err := c.Read(ctxT(t, 10*time.Second), opsOf(req, hold, spans)); err != nil {
			t.Fatal(err)
		}
		checkSpans(t, req, hold, spans)
		if got, want := reqCQs.Load(), int32(6*(i+1)); got != want {
			t.Errorf("requester CQs after %d connections = %d, want %d (one per QP)", i+1, got, want)
		}
	}
	hold.checkQPs(t, 12)
	if got := holdCQs.Load(); got != 2 {
		t.Errorf("holder created %d CQs for 12 QPs on 2 NICs, want 2", got)
	}
}
