package conn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// checkSentinel fails if any byte of b is not v.
func checkSentinel(t *testing.T, b []byte, v byte, what string) {
	t.Helper()
	for i, x := range b {
		if x != v {
			t.Fatalf("%s: byte at offset %d changed after Read returned", what, i)
		}
	}
}

// Lesson 9 (docs/lessons.md L9) on the completion-error path: one NIC's READs fail at once
// (REM_ACCESS_ERR: its snapshot rkey is wrong) while the same Read's
// batches on the other NIC are still waiting for delayed responses. Read
// must move those QPs to ERROR and wait for their flush before it
// returns: a sentinel written at once survives. Another Read holds the
// connection meanwhile (see TestReadDeadlineDrainsBeforeReturn).
func TestCompletionErrorDrainsOtherQPs(t *testing.T) {
	tests := []struct {
		name       string
		delay      time.Duration // holder NIC 0 ResponseDelay per READ
		asyncFlush time.Duration // requester AsyncFlush
	}{
		{"sync flush", 300 * time.Millisecond, 0},
		{"async flush", 100 * time.Millisecond, 300 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const nics, qps, opsPerNIC, opLen = 2, 2, 8, 64 << 10
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", nics: nics, qps: qps, mem: 4 << 20})
			req := newNode(t, d, nodeOpts{id: "req", nics: nics, qps: qps, mem: 4 << 20})
			hold.fillRandom(8)
			c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			if err != nil {
				t.Fatal(err)
			}
			hold.devs[0].SetFaults(tcp.Faults{ResponseDelay: tc.delay})
			for _, dev := range req.devs {
				dev.SetFaults(tcp.Faults{AsyncFlush: tc.asyncFlush})
			}
			for i := range c.nics[1].remote {
				c.nics[1].remote[i].RKey ^= 0x5a5a
			}
			other := holdRef(t, req, c)

			// Requester NIC i is on NUMA i: NUMA picks the NIC.
			var ops []ReadOp
			for k := 0; k < nics*opsPerNIC; k++ {
				off := uint64(k) * opLen
				ops = append(ops, ReadOp{LocalAddr: req.base() + off, RemoteAddr: hold.base() + off, Len: opLen, NUMA: k % nics})
			}
			start := time.Now()
			err = c.Read(ctxT(t, 10*time.Second), ops)
			took := time.Since(start)
			fill(req.mem, 0xA5) // reuse at once, as the requester's pool would
			var se *ibv.StatusError
			if !IsConnectionClass(err) || !errors.As(err, &se) || se.Status != ibv.WCRemAccessErr {
				t.Fatalf("Read = %v, want connection class wrapping REM_ACCESS_ERR", err)
			}
			time.Sleep(max(tc.delay, tc.asyncFlush) + 300*time.Millisecond)
			checkSentinel(t, req.mem, 0xA5, "local memory")
			if tc.asyncFlush > 0 && took < tc.asyncFlush {
				t.Errorf("Read took %v, less than the %v flush window: it returned before NIC 0's QPs flushed", took, tc.asyncFlush)
			}
			if !c.Invalid() {
				t.Error("connection not invalidated")
			}
			if got := testutil.ToFloat64(req.met.Invalidations.WithLabelValues("completion_error")); got != 1 {
				t.Errorf("invalidations{completion_error} = %v, want 1", got)
			}
			if got := testutil.ToFloat64(req.met.WorkCompletions.WithLabelValues(wcLabel(ibv.WCWRFlushErr))); got == 0 {
				t.Error("no WR_FLUSH_ERR completion: NIC 0's READs were not flushed")
			}
			other()
			waitFor(t, "QPs destroyed", func() bool { return req.nics.QPs() == 0 })
			req.checkQPs(t, 0)
		})
	}
}

// A QP that does not drain after ERROR within the drain timeout is
// destroyed by its worker (destroying is the other guarantee that no WR
// lands), counted in pegaflow_rdma_qp_drain_failures_total; Read returns
// then, and no byte lands afterwards. The "HCA" here flushes only after a
// minute (tcp AsyncFlush).
func TestQPDrainFailureDestroysQP(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", mem: 1 << 20})
	req := newNode(t, d, nodeOpts{id: "req", mem: 1 << 20})
	req.nics.drainTimeout = 200 * time.Millisecond // before any worker starts
	hold.fillRandom(12)
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	const delay = 100 * time.Millisecond
	hold.devs[0].SetFaults(tcp.Faults{ResponseDelay: delay})
	req.devs[0].SetFaults(tcp.Faults{AsyncFlush: time.Minute})
	// Another Read holds the connection, so the QP is destroyed by its
	// worker, not by the connection's teardown.
	other := holdRef(t, req, c)

	var ops []ReadOp
	for k := uint64(0); k < 8; k++ {
		ops = append(ops, ReadOp{LocalAddr: req.base() + k*4096, RemoteAddr: hold.base() + k*4096, Len: 4096, NUMA: -1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.Read(ctx, ops)
	took := time.Since(start)
	fill(req.mem, 0xA5)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read = %v, want deadline exceeded", err)
	}
	if took > 5*time.Second {
		t.Errorf("Read took %v: the drain timeout (200ms) must bound it", took)
	}
	if got := testutil.ToFloat64(req.met.QPDrainFailures); got != 1 {
		t.Errorf("pegaflow_rdma_qp_drain_failures_total = %v, want 1", got)
	}
	req.checkQPs(t, 0)    // destroyed by the worker although a Read holds c
	time.Sleep(8 * delay) // every delayed response would have come by now
	checkSentinel(t, req.mem, 0xA5, "local memory")
	if !c.Invalid() {
		t.Error("connection not invalidated")
	}
	other()
}
