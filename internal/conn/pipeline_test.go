package conn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// sqRecorder wraps a device so that each QP records, whenever a post
// starts a batch other than the one it posted last, how many WRs were
// outstanding (posted, not yet polled) on it at that moment.
type sqRecorder struct {
	ibv.Device
	mu sync.Mutex // guards atSwitch
	// atSwitch: outstanding WRs at each batch switch, all QPs.
	atSwitch []int
}

func (r *sqRecorder) CreateCQ(depth int) (ibv.CQ, error) {
	cq, err := r.Device.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	return &countingCQ{CQ: cq}, nil
}

func (r *sqRecorder) AllocPD() (ibv.PD, error) {
	pd, err := r.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return recordingPD{PD: pd, r: r}, nil
}

func (r *sqRecorder) switches() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.atSwitch...)
}

type countingCQ struct {
	ibv.CQ
	polled atomic.Int64
}

func (c *countingCQ) Poll(wcs []ibv.WorkCompletion) (int, error) {
	n, err := c.CQ.Poll(wcs)
	c.polled.Add(int64(n))
	return n, err
}

type recordingPD struct {
	ibv.PD
	r *sqRecorder
}

func (p recordingPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	cc := cq.(*countingCQ)
	qp, err := p.PD.CreateQP(cc.CQ, c)
	if err != nil {
		return nil, err
	}
	return &recordingQP{QP: qp, r: p.r, cq: cc}, nil
}

type recordingQP struct {
	ibv.QP
	r      *sqRecorder
	cq     *countingCQ
	posted int64  // worker-owned (one poster per QP)
	last   uint64 // batch tag of the last post
}

func (q *recordingQP) PostSend(wrs []ibv.SendWR) (int, error) {
	if tag := wrs[0].ID >> 32; tag != q.last {
		if q.last != 0 {
			q.r.mu.Lock()
			q.r.atSwitch = append(q.r.atSwitch, int(q.posted-q.cq.polled.Load()))
			q.r.mu.Unlock()
		}
		q.last = tag
	}
	bad, err := q.QP.PostSend(wrs)
	if err == nil {
		q.posted += int64(len(wrs))
	} else if bad > 0 {
		q.posted += int64(bad)
	}
	return bad, err
}

// TestSendQueueStaysFullAcrossBatches: two Reads in a loop on one QP, so
// that a batch is always queued behind the running one. The worker must
// post the next batch while the previous one still has READs in flight,
// not wait for all its completions first (the old worker always had 0
// outstanding at a batch switch: this test fails on it).
func TestSendQueueStaysFullAcrossBatches(t *testing.T) {
	d := newDialers(t)
	rec := &sqRecorder{}
	hold := newNode(t, d, nodeOpts{id: "holder", mem: 8 << 20})
	hold.fillRandom(7)
	req := newNode(t, d, nodeOpts{id: "req", mem: 8 << 20, sqDepth: 16,
		wrapDevice: func(dev ibv.Device) ibv.Device { rec.Device = dev; return rec }})
	c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	const opsPerRead, opLen = 48, 16 << 10
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for g := range 2 {
		spans := make([]span, opsPerRead)
		for i := range spans {
			off := uint64(g*opsPerRead+i) * opLen
			spans[i] = span{off, 4<<20 - off - opLen, opLen}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := c.Read(ctxT(t, 20*time.Second), opsOf(req, hold, spans)); err != nil {
					errs <- err
					return
				}
			}
			checkSpans(t, req, hold, spans)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sw := rec.switches()
	overlapped := 0
	for _, n := range sw {
		if n > 16 {
			t.Fatalf("%d WRs outstanding at a batch switch, over the SQ depth 16", n)
		}
		if n > 0 {
			overlapped++
		}
	}
	t.Logf("%d batch switches, %d with WRs of the previous batch in flight", len(sw), overlapped)
	if len(sw) < 10 || overlapped < len(sw)/4 {
		t.Fatalf("send queue drained between batches: %d of %d switches had WRs in flight", overlapped, len(sw))
	}
}

// failSecondBatch wraps a device so that a QP's post of the first chain
// of the second batch it ever sees fails (a broken QP).
type failSecondBatch struct {
	ibv.Device
	failed atomic.Bool
}

// CreateCQ's queues hand out one completion per Poll, so that a batch
// still has READs outstanding when the next one is admitted.
func (f *failSecondBatch) CreateCQ(depth int) (ibv.CQ, error) {
	cq, err := f.Device.CreateCQ(depth)
	if err != nil {
		return nil, err
	}
	return onePollCQ{cq}, nil
}

type onePollCQ struct{ ibv.CQ }

func (c onePollCQ) Poll(wcs []ibv.WorkCompletion) (int, error) { return c.CQ.Poll(wcs[:1]) }

func (f *failSecondBatch) AllocPD() (ibv.PD, error) {
	pd, err := f.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return failPD{PD: pd, f: f}, nil
}

type failPD struct {
	ibv.PD
	f *failSecondBatch
}

func (p failPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	qp, err := p.PD.CreateQP(cq.(onePollCQ).CQ, c)
	if err != nil {
		return nil, err
	}
	return &failQP{QP: qp, f: p.f}, nil
}

type failQP struct {
	ibv.QP
	f     *failSecondBatch
	first uint64 // tag of the first batch posted (worker-owned)
	slept bool
}

func (q *failQP) PostSend(wrs []ibv.SendWR) (int, error) {
	tag := wrs[0].ID >> 32
	if q.first == 0 {
		q.first = tag
	}
	if tag != q.first && q.f.failed.CompareAndSwap(false, true) {
		return 0, errInjected
	}
	bad, err := q.QP.PostSend(wrs)
	if tag == q.first && !q.slept {
		// Let the other Read queue its batch while this one's READs are
		// in flight: it is admitted as soon as this post returns.
		q.slept = true
		time.Sleep(200 * time.Millisecond)
	}
	return bad, err
}

// TestPipelinedBatchFailsWithQP: a failed post of one batch moves the QP
// to ERROR while the batch of another Read is in flight on it: that
// batch fails too (its WRs flush), both Reads return an error, and the
// connection is invalidated.
func TestPipelinedBatchFailsWithQP(t *testing.T) {
	d := newDialers(t)
	f := &failSecondBatch{}
	hold := newNode(t, d, nodeOpts{id: "holder", mem: 8 << 20})
	req := newNode(t, d, nodeOpts{id: "req", mem: 8 << 20, sqDepth: 8,
		wrapDevice: func(dev ibv.Device) ibv.Device { f.Device = dev; return f }})
	c, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	spans := make([]span, 64)
	for i := range spans {
		spans[i] = span{uint64(i) * 32 << 10, uint64(i) * 32 << 10, 32 << 10}
	}
	errs := make(chan error, 2)
	go func() { errs <- c.Read(ctxT(t, 20*time.Second), opsOf(req, hold, spans[:16])) }()
	time.Sleep(50 * time.Millisecond) // the first Read is posting
	go func() { errs <- c.Read(ctxT(t, 20*time.Second), opsOf(req, hold, spans[16:])) }()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrConnectionBroken) {
				t.Errorf("Read = %v, want ErrConnectionBroken", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("a Read did not return after its QP went to ERROR")
		}
	}
	if !f.failed.Load() {
		t.Fatal("the injected failure never ran")
	}
	waitFor(t, "connection invalidated", c.Invalid)
}

// BenchmarkReadConcurrent measures Read throughput over the tcp provider
// with several Reads in flight on one connection (as prefetches of
// several requests are): 16 ops of 64 KiB per Read, 1 NIC × 2 QPs, so
// batches of different Reads queue behind each other on every QP.
func BenchmarkReadConcurrent(b *testing.B) {
	d := newDialers(b)
	hold := newNode(b, d, nodeOpts{id: "holder", qps: 2, mem: 16 << 20})
	req := newNode(b, d, nodeOpts{id: "req", qps: 2, mem: 16 << 20, sqDepth: 16})
	c, err := req.dial.Get(ctxT(b, 10*time.Second), hold.addr)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Uint64
	b.SetBytes(16 * 64 << 10)
	b.SetParallelism(2)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := next.Add(1) % 8
		spans := make([]span, 16)
		for i := range spans {
			off := (g*16 + uint64(i)) * 64 << 10
			spans[i] = span{off, 8<<20 - off - 64<<10, 64 << 10}
		}
		ops := opsOf(req, hold, spans)
		for pb.Next() {
			if err := c.Read(context.Background(), ops); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
