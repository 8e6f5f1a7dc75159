package requester_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// TestE2EHolderGoneMidRead: issue 19 item 5. A holder whose data
// connections close under a READ (pegad stopped with SIGINT: its log says
// "connection reset by peer") shows on the requester as "peer closed the
// connection", errors.Is ibv.ErrPeerClosed, not only as "transport retry
// counter exceeded" (the completion status stays RETRY_EXC_ERR, as an HCA
// reports a vanished peer).
func TestE2EHolderGoneMidRead(t *testing.T) {
	h := newE2ENode(t, "holder", 16*mib, true, 0)
	req := newE2ENode(t, "requester", 16*mib, false, 0)
	putRandom(t, h, rand.New(rand.NewPCG(19, 5)), "ns", "a", []store.SlotSize{{KSize: 64 << 10, VSize: 64 << 10}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := req.conns.dial.Get(ctx, h.addr); err != nil {
		t.Fatal(err)
	}
	// Responses are held long enough that a cut finds the READs in flight.
	for _, d := range h.devs {
		d.SetFaults(tcp.Faults{ResponseDelay: 2 * time.Second})
	}
	errc := make(chan error, 1)
	go func() {
		_, err := req.engine.Prefetch(ctx, h.addr, "ns", [][]byte{[]byte("a")})
		errc <- err
	}()
	// The holder's side closes its data connections, again and again until
	// the fetch ends: a cut before the READ was sent is only an idle
	// connection the requester dials again.
	var err error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case err = <-errc:
			break wait
		case <-tick.C:
			for _, f := range req.engine.InFlight() {
				if f.Phase == requester.PhaseRead {
					for _, d := range h.devs {
						d.CutConnections()
					}
				}
			}
		}
	}
	if err == nil {
		t.Fatal("fetch succeeded though the holder closed its connections under it")
	}
	if !errors.Is(err, requester.ErrConnection) || !errors.Is(err, ibv.ErrPeerClosed) {
		t.Errorf("err = %v, want ErrConnection and ibv.ErrPeerClosed", err)
	}
	var se *ibv.StatusError
	if !errors.As(err, &se) || se.Status != ibv.WCRetryExcErr {
		t.Errorf("err = %v, want a RETRY_EXC_ERR completion", err)
	}
	if s := err.Error(); !strings.Contains(s, "peer closed the connection (") {
		t.Errorf("error does not say the peer closed the connection: %q", s)
	}
	t.Logf("requester error: %v", err)
}
