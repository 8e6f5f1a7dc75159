package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// span is one op expressed as offsets into the two pools.
type span struct{ local, remote, n uint64 }

func opsOf(req, hold *node, spans []span) []ReadOp {
	ops := make([]ReadOp, len(spans))
	for i, s := range spans {
		ops[i] = ReadOp{LocalAddr: req.base() + s.local, RemoteAddr: hold.base() + s.remote, Len: s.n, NUMA: -1}
	}
	return ops
}

func checkSpans(t *testing.T, req, hold *node, spans []span) {
	t.Helper()
	for i, s := range spans {
		got := req.mem[s.local : s.local+s.n]
		want := hold.mem[s.remote : s.remote+s.n]
		if !bytes.Equal(got, want) {
			t.Fatalf("span %d (%+v): bytes differ", i, s)
		}
	}
}

// scattered returns count non-overlapping spans of random sizes in
// [minN, maxN], at random places of both pools (K/V-like segments).
func scattered(r *rand.Rand, count int, minN, maxN, localSize, remoteSize uint64) []span {
	slot := localSize / uint64(count)
	if rs := remoteSize / uint64(count); rs < slot {
		slot = rs
	}
	lperm := r.Perm(count)
	rperm := r.Perm(count)
	out := make([]span, count)
	for i := range out {
		n := minN + r.Uint64N(maxN-minN+1)
		n = min(n, slot)
		out[i] = span{local: uint64(lperm[i]) * slot, remote: uint64(rperm[i])*slot + r.Uint64N(slot-n+1), n: n}
	}
	return out
}

func TestReadByteIdentical(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 48 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2, mem: 48 << 20, sqDepth: 8})
	hold.fillRandom(1)
	r := rand.New(rand.NewPCG(7, 7))

	c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	tests := []struct {
		name  string
		spans []span
	}{
		{"one byte", []span{{0, 5, 1}}},
		{"odd sizes", []span{{0, 3, 7}, {64, 4099, 4097}, {1 << 20, 12345, 1<<20 + 3}}},
		{"larger than one WR", []span{{0, 1 << 20, 20<<20 + 11}}},
		{"contiguous 32MiB", []span{{8 << 20, 0, 32 << 20}}},
		{"kv scattered 512", scattered(r, 512, 1, 16<<10, 48<<20, 48<<20)},
		{"kv scattered 64 large", scattered(r, 64, 64<<10, 512<<10, 48<<20, 48<<20)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clear(req.mem)
			if err := c.Read(ctxT(t, 20*time.Second), opsOf(req, hold, tc.spans)); err != nil {
				t.Fatalf("Read: %v", err)
			}
			checkSpans(t, req, hold, tc.spans)
		})
	}
	// NUMA preference: an op for NUMA 1, with nothing in flight, goes to
	// the NIC on NUMA 1 (planned alone: a plan's own bytes count against
	// a NIC, and a second op would spread).
	before := testutil.ToFloat64(req.met.WorkCompletions.WithLabelValues("success"))
	ops := opsOf(req, hold, []span{{0, 0, 4096}, {4096, 4096, 4096}})
	for i := range ops {
		ops[i].NUMA = 1
		batches, perNIC, err := c.plan(ops[i : i+1])
		if err != nil {
			t.Fatal(err)
		}
		c.settleNICBytes(perNIC)
		for _, b := range batches {
			if b.s.p.nic.info.NUMANode != 1 {
				t.Errorf("op for NUMA 1 planned on NIC %s (NUMA %d)", b.s.p.nic.info.Name, b.s.p.nic.info.NUMANode)
			}
		}
	}
	if err := c.Read(ctxT(t, 5*time.Second), ops); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(req.met.WorkCompletions.WithLabelValues("success")) - before; got != 2 {
		t.Errorf("success completions = %v, want 2", got)
	}
	req.checkQPs(t, 2*2)
	hold.checkQPs(t, 2*2)
	if w := req.workers(); w != 4 {
		t.Errorf("session workers = %d, want 4", w)
	}
	if got := testutil.ToFloat64(req.met.Conns.WithLabelValues(RoleRequester, StateConnected)); got != 1 {
		t.Errorf("requester connected gauge = %v, want 1", got)
	}
	if got := testutil.ToFloat64(hold.met.Conns.WithLabelValues(RoleHolder, StateConnected)); got != 1 {
		t.Errorf("holder connected gauge = %v, want 1", got)
	}
	list := req.list()
	if len(list) != 1 || list[0].Role != RoleRequester || list[0].QPs != 4 || len(list[0].NICs) != 2 || list[0].RemoteNodeID != "holder" {
		t.Errorf("requester List = %+v", list)
	}
	hl := hold.list()
	if len(hl) != 1 || hl[0].Role != RoleHolder || hl[0].QPs != 4 || hl[0].RemoteNodeID != "req" {
		t.Errorf("holder List = %+v", hl)
	}
}

// Two holders allocate identical QPNs (same tcp QPNStart); one requester
// reads from both at once: no error, right data, no cross-talk.
func TestTwoHoldersSameQPNs(t *testing.T) {
	const nics, qps = 2, 2
	d := newDialers(t)
	h1 := newNode(t, d, nodeOpts{id: "h1", nics: nics, qps: qps, qpnStart: 0x500, mem: 8 << 20})
	h2 := newNode(t, d, nodeOpts{id: "h2", nics: nics, qps: qps, qpnStart: 0x500, mem: 8 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: nics, qps: qps, qpnStart: 0x500, mem: 16 << 20})
	h1.fillRandom(11)
	h2.fillRandom(22)

	c1, err := req.dial.Get(ctxT(t, 10*time.Second), h1.addr)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := req.dial.Get(ctxT(t, 10*time.Second), h2.addr)
	if err != nil {
		t.Fatal(err)
	}
	q1 := h1.list()[0].NICs[0].LocalQPNs
	q2 := h2.list()[0].NICs[0].LocalQPNs
	if fmt.Sprint(q1) != fmt.Sprint(q2) {
		t.Fatalf("holders were meant to allocate identical QPNs: %v vs %v", q1, q2)
	}
	req.checkQPs(t, 2*nics*qps) // peers × NICs × qps_per_peer
	h1.checkQPs(t, nics*qps)
	h2.checkQPs(t, nics*qps)

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 3))
			// Each goroutine owns a 512 KiB local slice: h1 data in the
			// first half, h2 data in the second.
			lbase := uint64(i) * (1 << 20)
			s1 := []span{{lbase, r.Uint64N(7 << 20), 256 << 10}}
			s2 := []span{{lbase + 512<<10, r.Uint64N(7 << 20), 256 << 10}}
			for k := 0; k < 10; k++ {
				if err := c1.Read(context.Background(), opsOf(req, h1, s1)); err != nil {
					errs <- err
					return
				}
				if err := c2.Read(context.Background(), opsOf(req, h2, s2)); err != nil {
					errs <- err
					return
				}
			}
			for _, p := range []struct {
				h *node
				s span
			}{{h1, s1[0]}, {h2, s2[0]}} {
				if !bytes.Equal(req.mem[p.s.local:p.s.local+p.s.n], p.h.mem[p.s.remote:p.s.remote+p.s.n]) {
					errs <- fmt.Errorf("goroutine %d: data from %s differs (cross-talk?)", i, p.h.id)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if c1.Invalid() || c2.Invalid() {
		t.Error("a connection was invalidated")
	}
}

// 1,000 connect/invalidate cycles from several goroutines: goroutines, QPs
// and session workers come back to baseline (goleak checks goroutines at
// the end of the package).
func TestConnectInvalidateCycles(t *testing.T) {
	const nics, qps, cycles, par = 2, 2, 1000, 4
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: nics, qps: qps, mem: 1 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: nics, qps: qps, mem: 1 << 20})
	hold.fillRandom(5)

	var (
		wg       sync.WaitGroup
		progress atomic.Int64 // cycles completed
	)
	errs := make(chan error, par)
	for g := 0; g < par; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < cycles/par; i++ {
				progress.Add(1)
				c, err := req.dial.Get(context.Background(), hold.addr)
				if err != nil {
					errs <- fmt.Errorf("cycle %d: Get: %w", i, err)
					return
				}
				off := uint64(g) * 4096
				err = c.Read(context.Background(), opsOf(req, hold, []span{{off, off, 4096}}))
				// Another goroutine may invalidate c under us: that must
				// surface as a connection-class error, nothing else.
				if err != nil && !IsConnectionClass(err) {
					errs <- fmt.Errorf("cycle %d: Read: %w", i, err)
					return
				}
				req.dial.Invalidate(c, nil)
			}
		}()
	}
	// Watchdog: Invalidate tears an idle connection down at once, and
	// teardown waits for the workers; a worker that ignores its
	// connection's done would hang a cycle forever. Fail by name instead,
	// leaving the stuck goroutines to goleak.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for last, lastAt := int64(-1), time.Now(); ; {
		select {
		case <-finished:
		case <-time.After(100 * time.Millisecond):
			if p := progress.Load(); p != last {
				last, lastAt = p, time.Now()
			} else if time.Since(lastAt) > 10*time.Second {
				req.abandon()
				t.Fatalf("no cycle completed for 10s after %d: a session worker did not exit after invalidation (teardown waits for it)", p)
			}
			continue
		}
		break
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return req.workers() == 0 }) {
		req.abandon()
		t.Fatalf("pegaflow_session_workers = %d after every connection was invalidated, want 0", req.workers())
	}
	waitFor(t, "requester QPs to drain", func() bool { return req.nics.QPs() == 0 })
	req.checkQPs(t, 0)
	// Every connection was invalidated, so the holder frees every accepted
	// one (the last by its disconnect; earlier ones by disconnect or by
	// replacement, a late disconnect never touching a newer one).
	waitFor(t, "holder's accepted connections released", func() bool { return hold.nics.QPs() == 0 })
	hold.checkQPs(t, 0)
	if n := len(hold.list()); n != 0 {
		t.Errorf("holder has %d accepted connections, want 0", n)
	}
	if got := testutil.ToFloat64(req.met.Conns.WithLabelValues(RoleRequester, StateInvalidated)); got != 0 {
		t.Errorf("invalidated-but-not-torn-down gauge = %v", got)
	}
	t.Logf("handshakes served: %d", hold.handshakes.Load())
}

// The worker exits when its connection is invalidated: the batch it is
// running finishes, queued ones and later submissions get
// ErrSessionInvalidated.
func TestWorkerExitsOnInvalidate(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", mem: 1 << 20})
	req := newNode(t, d, nodeOpts{id: "req", mem: 1 << 20})
	hold.fillRandom(9)
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	hold.devs[0].SetFaults(tcp.Faults{ResponseDelay: 200 * time.Millisecond})
	s := c.nics[0].sessions[0]

	// Hold a reference as a Read would, so the QP outlives invalidation.
	rel := holdRef(t, req, c)
	mk := func(off uint64) (*batch, chan batchResult) {
		res := make(chan batchResult, 1)
		ops := opsOf(req, hold, []span{{off, off, 4096}})
		bs, _, err := c.plan(ops)
		if err != nil || len(bs) != 1 {
			t.Fatalf("plan: %v", err)
		}
		bs[0].ctx, bs[0].res = context.Background(), res
		return bs[0], res
	}
	running, runRes := mk(0)
	queued1, q1Res := mk(4096)
	queued2, q2Res := mk(8192)
	s.submit(running)
	waitFor(t, "first batch to run", func() bool { return running.state.Load() == batchRunning })
	s.submit(queued1)
	s.submit(queued2)
	req.dial.Invalidate(c, errors.New("test"))

	if r := <-runRes; r.err != nil {
		t.Errorf("running batch: %v (it must finish: its Read holds the QP)", r.err)
	}
	for i, ch := range []chan batchResult{q1Res, q2Res} {
		select {
		case r := <-ch:
			if !errors.Is(r.err, ErrSessionInvalidated) || r.err.Error() == "" {
				t.Errorf("queued batch %d: %v, want ErrSessionInvalidated", i, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("queued batch %d got no reply", i)
		}
	}
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		// Releasing the reference (teardown) or closing the manager would
		// wait for the worker forever: leave both to goleak.
		req.abandon()
		t.Fatal("worker did not exit after invalidation")
	}
	late, lateRes := mk(12288)
	s.submit(late)
	select {
	case r := <-lateRes:
		if !errors.Is(r.err, ErrSessionInvalidated) {
			t.Errorf("submit after exit: %v", r.err)
		}
	case <-time.After(time.Second):
		t.Fatal("submit after the worker exited blocked")
	}
	// The gauge drops as each worker's goroutine returns, just after its
	// session's exited channel closes (and the connection's other QPs'
	// workers exit on their own).
	waitFor(t, "every session worker gone after invalidate", func() bool { return req.workers() == 0 })
	// queued1, queued2 and the late submission; never the running batch.
	if got := testutil.ToFloat64(req.met.BatchesInvalidated); got != 3 {
		t.Errorf("pegaflow_session_batches_invalidated_total = %v, want 3", got)
	}
	req.checkQPs(t, 1) // still held by our reference
	rel()
	req.checkQPs(t, 0)
	if !bytes.Equal(req.mem[:4096], hold.mem[:4096]) {
		t.Error("running batch data wrong")
	}
	// Reads on the invalidated connection fail at once, connection class.
	if err := c.Read(context.Background(), opsOf(req, hold, []span{{0, 0, 8}})); !errors.Is(err, ErrConnectionBroken) {
		t.Errorf("Read on invalidated: %v", err)
	}
}

// Lesson 9 (docs/lessons.md L9): after a deadline, Read returns only when no late READ can
// land; a sentinel written after it returns survives the late responses.
// "async flush" models a real HCA (tcp Faults.AsyncFlush on the
// requester's devices): ToError returns at once while responses in flight
// are still written until the flush completions arrive, so Read must wait
// for those completions, not merely for ToError. Responses come every
// 100 ms per QP, so several land inside the 300 ms flush window.
// Another Read holds the connection meanwhile (as concurrent fetches do):
// otherwise the failed Read's own release would be the last reference,
// and teardown, which waits for the workers, would hide a Read that
// returns before its batches.
func TestReadDeadlineDrainsBeforeReturn(t *testing.T) {
	tests := []struct {
		name       string
		delay      time.Duration // holder ResponseDelay per READ
		asyncFlush time.Duration // requester AsyncFlush
	}{
		{"sync flush", 300 * time.Millisecond, 0},
		{"async flush", 100 * time.Millisecond, 300 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 8 << 20})
			req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2, mem: 8 << 20})
			hold.fillRandom(3)
			c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			if err != nil {
				t.Fatal(err)
			}
			for _, dev := range hold.devs {
				dev.SetFaults(tcp.Faults{ResponseDelay: tc.delay})
			}
			for _, dev := range req.devs {
				dev.SetFaults(tcp.Faults{AsyncFlush: tc.asyncFlush})
			}
			other := holdRef(t, req, c)
			spans := scattered(rand.New(rand.NewPCG(1, 2)), 64, 4096, 64<<10, 8<<20, 8<<20)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = c.Read(ctx, opsOf(req, hold, spans))
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Read = %v, want deadline exceeded", err)
			}
			if tc.asyncFlush == 0 && took >= tc.delay {
				t.Errorf("Read took %v: it should abort (ERROR + flush), not wait for the responses", took)
			}
			// Reuse the memory at once, as the requester's pool would.
			for i := range req.mem {
				req.mem[i] = 0xA5
			}
			time.Sleep(max(tc.delay, tc.asyncFlush) + 300*time.Millisecond)
			for i, b := range req.mem {
				if b != 0xA5 {
					t.Fatalf("late READ landed at offset %d after Read returned (Read took %v)", i, took)
				}
			}
			if tc.asyncFlush > 0 && took < tc.asyncFlush {
				t.Errorf("Read took %v, less than the %v flush window: it returned before its QPs flushed", took, tc.asyncFlush)
			}
			if !c.Invalid() {
				t.Error("a connection whose QPs went to ERROR must be invalidated")
			}
			other()
			waitFor(t, "QPs destroyed", func() bool { return req.nics.QPs() == 0 })
			if got := testutil.ToFloat64(req.met.Invalidations.WithLabelValues("deadline")); got != 1 {
				t.Errorf("invalidations{deadline} = %v", got)
			}
			if got := testutil.ToFloat64(req.met.QPDrainFailures); got != 0 {
				t.Errorf("qp drain failures = %v, want 0 (every QP flushed)", got)
			}
			// A fresh connection works.
			for _, dev := range hold.devs {
				dev.SetFaults(tcp.Faults{})
			}
			c2, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			if err != nil || c2 == c {
				t.Fatalf("re-Get: %v (same=%v)", err, c2 == c)
			}
			if err := c2.Read(ctxT(t, 5*time.Second), opsOf(req, hold, spans)); err != nil {
				t.Fatal(err)
			}
			checkSpans(t, req, hold, spans)
		})
	}
}

// A ctx that is already done posts nothing and leaves the connection up.
func TestReadExpiredCtxKeepsConnection(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder"})
	req := newNode(t, d, nodeOpts{id: "req"})
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Read(ctx, opsOf(req, hold, []span{{0, 0, 64}})); !errors.Is(err, context.Canceled) {
		t.Fatalf("Read = %v", err)
	}
	if c.Invalid() {
		t.Error("nothing was posted; the connection must stay healthy")
	}
}

func TestCompletionErrorBreaksConnection(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(c *AddrConnection, hold *node)
		status ibv.WCStatus // 0: any
	}{
		{"wrong rkey", func(c *AddrConnection, _ *node) {
			for _, cn := range c.nics {
				for i := range cn.remote {
					cn.remote[i].RKey ^= 0x5a5a
				}
			}
		}, ibv.WCRemAccessErr},
		{"holder cut", func(_ *AddrConnection, hold *node) {
			hold.devs[0].SetFaults(tcp.Faults{DropResponses: true})
			hold.devs[0].CutConnections()
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", mem: 1 << 20})
			req := newNode(t, d, nodeOpts{id: "req", mem: 1 << 20})
			c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Read(ctxT(t, 5*time.Second), opsOf(req, hold, []span{{0, 0, 4096}})); err != nil {
				t.Fatal(err)
			}
			tc.break_(c, hold)
			err = c.Read(ctxT(t, 10*time.Second), opsOf(req, hold, []span{{0, 0, 4096}, {4096, 4096, 4096}}))
			var se *ibv.StatusError
			if !errors.Is(err, ErrConnectionBroken) || !errors.As(err, &se) {
				t.Fatalf("Read = %v, want ErrConnectionBroken wrapping *ibv.StatusError", err)
			}
			if tc.status != 0 && se.Status != tc.status {
				t.Errorf("status = %v, want %v", se.Status, tc.status)
			}
			if !c.Invalid() {
				t.Error("connection not invalidated")
			}
			waitFor(t, "QPs destroyed", func() bool { return req.nics.QPs() == 0 })
			if got := testutil.ToFloat64(req.met.Invalidations.WithLabelValues("completion_error")); got != 1 {
				t.Errorf("invalidations{completion_error} = %v", got)
			}
			hold.devs[0].SetFaults(tcp.Faults{})
			c2, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			if err != nil || c2 == c {
				t.Fatalf("re-Get after broken: %v", err)
			}
			if n := hold.handshakes.Load(); n != 2 {
				t.Errorf("handshakes = %d, want 2", n)
			}
		})
	}
}

// Lesson 7 (docs/lessons.md L7): a bad address is not a connection-class error.
func TestInvalidOpsKeepConnection(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, mem: 1 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, mem: 1 << 20})
	hold.fillRandom(4)
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	hb, rb := hold.base(), req.base()
	tests := []struct {
		name string
		op   ReadOp
		want error
	}{
		{"remote past end", ReadOp{LocalAddr: rb, RemoteAddr: hb + 1<<20 - 10, Len: 100, NUMA: -1}, ErrRemoteMemory},
		{"remote before start", ReadOp{LocalAddr: rb, RemoteAddr: hb - 4096, Len: 100, NUMA: -1}, ErrRemoteMemory},
		{"remote wraps", ReadOp{LocalAddr: rb, RemoteAddr: ^uint64(0) - 10, Len: 100, NUMA: -1}, ErrRemoteMemory},
		{"local past end", ReadOp{LocalAddr: rb + 1<<20 - 10, RemoteAddr: hb, Len: 100, NUMA: -1}, ErrInvalidOp},
		{"local before start", ReadOp{LocalAddr: rb - 1, RemoteAddr: hb, Len: 100, NUMA: -1}, ErrInvalidOp},
		{"zero length", ReadOp{LocalAddr: rb, RemoteAddr: hb, Len: 0, NUMA: -1}, ErrInvalidOp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			good := ReadOp{LocalAddr: rb + 8192, RemoteAddr: hb + 8192, Len: 64, NUMA: -1}
			err := c.Read(ctxT(t, 5*time.Second), []ReadOp{good, tc.op})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Read = %v, want %v", err, tc.want)
			}
			if IsConnectionClass(err) || c.Invalid() {
				t.Fatal("connection invalidated by a non-connection error")
			}
		})
	}
	if got := testutil.ToFloat64(req.met.WorkCompletions.WithLabelValues("success")); got != 0 {
		t.Errorf("%v completions: something was posted for a rejected Read", got)
	}
	if err := c.Read(ctxT(t, 5*time.Second), opsOf(req, hold, []span{{0, 0, 4096}})); err != nil {
		t.Fatalf("connection not healthy afterwards: %v", err)
	}
	checkSpans(t, req, hold, []span{{0, 0, 4096}})
}

func TestConcurrentGetOneHandshake(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2})
	const n = 32
	got := make([]*AddrConnection, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
			if err != nil {
				t.Errorf("Get: %v", err)
			}
			got[i] = c
		}()
	}
	close(start)
	wg.Wait()
	for i := 1; i < n; i++ {
		if got[i] != got[0] {
			t.Fatalf("caller %d got a different connection", i)
		}
	}
	if h := hold.handshakes.Load(); h != 1 {
		t.Errorf("holder served %d handshakes, want 1", h)
	}
	req.checkQPs(t, 4)
	hold.checkQPs(t, 4)
}

func TestHandshakeFailuresDestroyPreparedQPs(t *testing.T) {
	tests := []struct {
		name  string
		reply func(*pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error)
		want  []error
	}{
		{"peer error", func(*pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
			return nil, errors.New("no")
		}, []error{ErrHandshakeRejected}},
		{"no nics", func(*pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
			return &pegadv1.RdmaHandshakeResponse{HolderNodeId: "h"}, nil
		}, []error{ErrHandshakeRejected, ErrInvalidHandshake}},
		{"endpoint count", func(r *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
			nh := &pegadv1.NicHandshake{Nic: "x", Endpoints: r.Nics[0].Endpoints[:1], Memory: r.Nics[0].Memory}
			return &pegadv1.RdmaHandshakeResponse{Nics: []*pegadv1.NicHandshake{nh}}, nil
		}, []error{ErrHandshakeRejected, ErrInvalidHandshake}},
		{"empty memory", func(r *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
			nh := &pegadv1.NicHandshake{Nic: "x", Endpoints: r.Nics[0].Endpoints}
			return &pegadv1.RdmaHandshakeResponse{Nics: []*pegadv1.NicHandshake{nh}}, nil
		}, []error{ErrHandshakeRejected, ErrInvalidHandshake}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder"})
			req := newNode(t, d, nodeOpts{id: "req", qps: 2})
			hold.reply.Store(&tc.reply)
			_, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("Get = %v, want %v", err, w)
				}
			}
			req.checkQPs(t, 0)
			if n := len(req.list()); n != 0 {
				t.Errorf("%d connections listed after a failed handshake", n)
			}
			if got := testutil.ToFloat64(req.met.Conns.WithLabelValues(RoleRequester, StateConnecting)); got != 0 {
				t.Errorf("connecting gauge = %v", got)
			}
		})
	}
	t.Run("peer unreachable", func(t *testing.T) {
		d := newDialers(t)
		req := newNode(t, d, nodeOpts{id: "req"})
		_, err := req.dial.Get(ctxT(t, 10*time.Second), "127.0.0.1:1")
		if !errors.Is(err, ErrConnectionBroken) {
			t.Errorf("Get = %v, want ErrConnectionBroken", err)
		}
		req.checkQPs(t, 0)
	})
}

// A failure after some QPs were created aborts the accept: no QP left.
// A restarted requester (same node id, new incarnation) replaces its stale
// accepted connection on the holder.
// An older, slow accept of the same requester never replaces the newer
// one that already completed: it is aborted and leaves no QP.
// A handshake in flight is listed as connecting, and only once published
// as connected.
func TestListShowsConnecting(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder"})
	req := newNode(t, d, nodeOpts{id: "req"})
	reached, release := make(chan struct{}), make(chan struct{})
	req.dial.hookBeforeRPC = func(string) { close(reached); <-release }
	errc := make(chan error, 1)
	go func() {
		_, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
		errc <- err
	}()
	<-reached
	l := req.list()
	if len(l) != 1 || l[0].State != StateConnecting || l[0].Peer != hold.addr {
		t.Errorf("List during handshake = %+v", l)
	}
	if got := testutil.ToFloat64(req.met.Conns.WithLabelValues(RoleRequester, StateConnecting)); got != 1 {
		t.Errorf("connecting gauge = %v", got)
	}
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	l = req.list()
	if len(l) != 1 || l[0].State != StateConnected {
		t.Errorf("List after handshake = %+v", l)
	}
}

// BenchmarkRead measures Read throughput over the tcp provider: 64 ops of
// 64 KiB per Read, 2 NICs × 2 QPs.
func BenchmarkRead(b *testing.B) {
	d := newDialers(b)
	hold := newNode(b, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 8 << 20})
	req := newNode(b, d, nodeOpts{id: "req", nics: 2, qps: 2, mem: 8 << 20})
	c, err := req.dial.Get(ctxT(b, 10*time.Second), hold.addr)
	if err != nil {
		b.Fatal(err)
	}
	spans := make([]span, 64)
	for i := range spans {
		spans[i] = span{uint64(i) * 64 << 10, uint64(63-i) * 64 << 10, 64 << 10}
	}
	ops := opsOf(req, hold, spans)
	b.SetBytes(64 * 64 << 10)
	b.ResetTimer()
	for b.Loop() {
		if err := c.Read(context.Background(), ops); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSliceVsWhole: Reads of segs segments of 8 MiB over the tcp
// provider, 2 NICs x 2 QPs, sliced into 1 MiB WRs (the default) vs one WR
// per segment (SliceBytes 8 MiB, the old planner), the two requesters
// alternating on the same holder in every iteration.
func BenchmarkSliceVsWhole(b *testing.B) {
	for _, segs := range []int{1, 4} {
		b.Run(fmt.Sprintf("segs=%d", segs), func(b *testing.B) { benchSliceVsWhole(b, segs) })
	}
}

func benchSliceVsWhole(b *testing.B, segs int) {
	const seg = 8 << 20
	d := newDialers(b)
	hold := newNode(b, d, nodeOpts{id: "holder", nics: 2, qps: 2, mem: 4 * seg})
	sliced := newNode(b, d, nodeOpts{id: "sliced", nics: 2, qps: 2, mem: 4 * seg})
	whole := newNode(b, d, nodeOpts{id: "whole", nics: 2, qps: 2, mem: 4 * seg, sliceBytes: seg})
	spans := []span{{0, 3 * seg, seg}, {seg, 2 * seg, seg}, {2 * seg, seg, seg}, {3 * seg, 0, seg}}[:segs]
	type side struct {
		c   *AddrConnection
		ops []ReadOp
		d   time.Duration
	}
	var sides []*side
	for _, n := range []*node{sliced, whole} {
		c, err := n.dial.Get(ctxT(b, 10*time.Second), hold.addr)
		if err != nil {
			b.Fatal(err)
		}
		s := &side{c: c, ops: opsOf(n, hold, spans)}
		if err := c.Read(context.Background(), s.ops); err != nil { // warm up: first touch of the pages
			b.Fatal(err)
		}
		sides = append(sides, s)
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		for k := range sides {
			s := sides[(i+k)%2]
			start := time.Now()
			if err := s.c.Read(context.Background(), s.ops); err != nil {
				b.Fatal(err)
			}
			s.d += time.Since(start)
		}
		i++
	}
	mb := float64(segs*seg) * float64(b.N) / 1e6
	b.ReportMetric(mb/sides[0].d.Seconds(), "sliced-MB/s")
	b.ReportMetric(mb/sides[1].d.Seconds(), "whole-MB/s")
}
