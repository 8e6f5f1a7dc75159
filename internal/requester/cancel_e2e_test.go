package requester_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// TestE2ECancelSparesOtherFetches (issue 15 item 11): two fetches read
// over one connection to a real holder; cancelling one breaks the
// connection's QPs under the other, which retries once on a fresh
// connection and gets its block byte-identical. Every lock is released.
func TestE2ECancelSparesOtherFetches(t *testing.T) {
	h := newE2ENode(t, "holder", 64*mib, true, 0)
	req := newE2ENode(t, "requester", 64*mib, false, 0)
	r := rand.New(rand.NewPCG(15, 11))
	shape := []store.SlotSize{{KSize: 64 << 10, VSize: 64 << 10}, {KSize: 64 << 10, VSize: 64 << 10}}
	putRandom(t, h, r, "ns", "a", shape)
	wantB := putRandom(t, h, r, "ns", "b", shape)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Connect first, so both fetches share the connection and the delay
	// slows only their READs.
	if _, err := req.conns.dial.Get(ctx, h.addr); err != nil {
		t.Fatal(err)
	}
	for _, d := range h.devs {
		d.SetFaults(tcp.Faults{ResponseDelay: 300 * time.Millisecond})
	}

	// reading waits until n fetches are in the read phase, then a little
	// longer, so their READs are posted (responses held by the delay).
	reading := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := 0
			for _, f := range req.engine.InFlight() {
				if f.Phase == requester.PhaseRead {
					got++
				}
			}
			if got >= n {
				time.Sleep(30 * time.Millisecond)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d fetches never reached the read phase: %+v", n, req.engine.InFlight())
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A first: its batches run on both QPs; B's queue behind them.
	ctxA, cancelA := context.WithCancel(ctx)
	defer cancelA()
	errA := make(chan error, 1)
	go func() {
		_, err := req.engine.Prefetch(ctxA, h.addr, "ns", [][]byte{[]byte("a")})
		errA <- err
	}()
	reading(1)
	type out struct {
		res *requester.Result
		err error
	}
	outB := make(chan out, 1)
	go func() {
		res, err := req.engine.Prefetch(ctx, h.addr, "ns", [][]byte{[]byte("b")})
		outB <- out{res, err}
	}()
	reading(2)
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fetch: %v, want context.Canceled", err)
	}
	for _, d := range h.devs {
		d.SetFaults(tcp.Faults{})
	}
	b := <-outB
	if b.err != nil {
		t.Fatalf("the other fetch failed with the cancelled one: %v", b.err)
	}
	if b.res.Blocks[0].Status != requester.StatusFetched || !bytes.Equal(readBlock(t, req, "ns", "b"), wantB) {
		t.Fatalf("block b: %v, or its bytes differ", b.res.Blocks[0].Status)
	}
	checkHolderClean(t, h)
}
