package tcp

import (
	"bytes"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const peerQPNStart = 0x4242

// newProvider starts a requester device and two peer devices that allocate
// identical QPNs, closed at cleanup.
func newProvider(t *testing.T) (*Provider, [3]*Device) {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	p, err := NewProvider(
		DeviceOptions{Name: "req", QPNStart: 0x100, Logger: &log},
		DeviceOptions{Name: "peer1", QPNStart: peerQPNStart, Logger: &log},
		DeviceOptions{Name: "peer2", QPNStart: peerQPNStart, Logger: &log},
	)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	var devs [3]*Device
	for i, n := range []string{"req", "peer1", "peer2"} {
		d, err := p.Open(n)
		if err != nil {
			t.Fatalf("open %s: %v", n, err)
		}
		devs[i] = d.(*Device)
	}
	return p, devs
}

func TestConformance(t *testing.T) {
	ibvtest.Run(t, func(t *testing.T) ibvtest.Env {
		_, d := newProvider(t)
		return ibvtest.Env{Requester: d[0], Peer1: d[1], Peer2: d[2], SameQPNs: true}
	})
}

// TestSeparateProviders: the requester and the peer live in different
// providers (as two daemons do) and still interoperate.
func TestSeparateProviders(t *testing.T) {
	_, a := newProvider(t)
	_, b := newProvider(t)
	req, peer := ibvtest.Pair(t, a[0], b[1], ibvtest.DefaultCap())
	rmem, rmr := ibvtest.Region(t, peer, 1<<20, ibv.AccessLocalWrite|ibv.AccessRemoteRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 1<<20, ibv.AccessLocalWrite, 2)
	post(t, req.QP, readWR(1, lmr, rmr, 0, 1<<20))
	expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)
	if !bytes.Equal(lmem, rmem) {
		t.Fatal("data differs")
	}
}

func TestProviderBasics(t *testing.T) {
	p, d := newProvider(t)
	if p.Name() != "tcp" {
		t.Fatalf("name %q", p.Name())
	}
	infos, err := p.Devices()
	if err != nil || len(infos) != 3 {
		t.Fatalf("devices %v, %v", infos, err)
	}
	for i, in := range infos {
		if in.Addr != d[i].Info().Addr || in.LinkLayer != "tcp" || in.MaxRdAtomic != maxRdAtomic {
			t.Fatalf("device %d info %+v", i, in)
		}
	}
	if _, err := p.Open("nope"); err == nil {
		t.Fatal("open of unknown device succeeded")
	}
	if _, err := NewProvider(DeviceOptions{Name: "x"}, DeviceOptions{Name: "x"}); err == nil {
		t.Fatal("duplicate names accepted")
	}
	def, err := NewProvider()
	if err != nil {
		t.Fatalf("default provider: %v", err)
	}
	defer def.Close()
	if _, err := def.Open("tcp0"); err != nil {
		t.Fatalf("default device tcp0: %v", err)
	}
	// QPNs are per device and start at QPNStart.
	s1 := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	s2 := ibvtest.NewSide(t, d[2], ibvtest.DefaultCap())
	if s1.QP.QPN() != peerQPNStart || s2.QP.QPN() != peerQPNStart {
		t.Fatalf("QPNs %#x %#x, want both %#x", s1.QP.QPN(), s2.QP.QPN(), peerQPNStart)
	}
	// RegMR rejects REMOTE_WRITE without LOCAL_WRITE, as verbs does.
	mem := ibvtest.MapMemory(t, 4096)
	if _, err := s1.PD.RegMR(mem, ibv.AccessRemoteWrite); err == nil {
		t.Fatal("REMOTE_WRITE without LOCAL_WRITE accepted")
	}
}

func post(t testing.TB, qp ibv.QP, wrs ...ibv.SendWR) {
	t.Helper()
	if bad, err := qp.PostSend(wrs); err != nil {
		t.Fatalf("post: bad=%d: %v", bad, err)
	}
}

func readWR(id uint64, l, r ibv.MR, off uint64, n uint32) ibv.SendWR {
	return ibv.SendWR{ID: id, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: l.Addr() + off, Length: n,
		LKey: l.LKey(), RemoteAddr: r.Addr() + off, RKey: r.RKey()}
}

func expect(t *testing.T, wc ibv.WorkCompletion, id uint64, st ibv.WCStatus) {
	t.Helper()
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion wr_id=%d %s, want wr_id=%d %s", wc.ID, wc.Status, id, st)
	}
}

const accRead = ibv.AccessLocalWrite | ibv.AccessRemoteRead

// TestFaultDelayToErrorNoLateByte is docs/lessons.md L9 at the provider level: with
// READ responses delayed, ToError + drain, then the memory is reused; no
// late response byte may land in it.
func TestFaultDelayToErrorNoLateByte(t *testing.T) {
	_, d := newProvider(t)
	d[1].SetFaults(Faults{ResponseDelay: 100 * time.Millisecond})
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 1<<20, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 1<<20, accRead, 2)
	const count = 8
	for i := range count {
		post(t, req.QP, readWR(uint64(i), lmr, rmr, 0, 1<<20))
	}
	time.Sleep(150 * time.Millisecond) // the first responses are on their way
	if err := req.QP.ToError(); err != nil {
		t.Fatal(err)
	}
	wcs := ibvtest.Collect(t, req.CQ, count)
	flushed := 0
	for _, wc := range wcs {
		if wc.Status == ibv.WCWRFlushErr {
			flushed++
		}
	}
	if flushed == 0 {
		t.Fatalf("no READ was flushed: %v", wcs)
	}
	clear(lmem) // "reused"
	time.Sleep(300 * time.Millisecond)
	for i, b := range lmem {
		if b != 0 {
			t.Fatalf("late byte at %d after ToError+drain", i)
		}
	}
}

// TestFaultAsyncFlush: with Faults.AsyncFlush, ToError returns at once but
// READ responses in flight still land until the WR_FLUSH_ERR completions
// are delivered, AsyncFlush later (a real HCA); after those completions
// nothing lands. A WR posted in the window is flushed after the others.
func TestFaultAsyncFlush(t *testing.T) {
	const (
		delay = 100 * time.Millisecond // per READ, served one after another
		flush = 300 * time.Millisecond
		chunk = 64 << 10
		count = 8
	)
	_, d := newProvider(t)
	d[1].SetFaults(Faults{ResponseDelay: delay})
	d[0].SetFaults(Faults{AsyncFlush: flush})
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	rmem, rmr := ibvtest.Region(t, peer, count*chunk, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, count*chunk, accRead, 2)
	for i := range count {
		post(t, req.QP, readWR(uint64(i), lmr, rmr, uint64(i)*chunk, chunk))
	}
	time.Sleep(delay / 2)
	start := time.Now()
	if err := req.QP.ToError(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > delay/2 {
		t.Errorf("ToError took %v with AsyncFlush: it must return at once", took)
	}
	if st := req.QP.State(); st != ibv.QPSError {
		t.Errorf("state after ToError = %s, want ERROR", st)
	}
	clear(lmem) // premature reuse: responses in flight may still land
	post(t, req.QP, readWR(count, lmr, rmr, 0, chunk))
	wcs := ibvtest.Collect(t, req.CQ, count+1)
	drained := time.Since(start)
	if drained < flush {
		t.Errorf("flush completions after %v, want ≥ AsyncFlush %v", drained, flush)
	}
	success := 0
	for i, wc := range wcs {
		if wc.ID != uint64(i) {
			t.Fatalf("completion %d is wr_id %d: out of order", i, wc.ID)
		}
		switch wc.Status {
		case ibv.WCSuccess:
			success++
			if !bytes.Equal(lmem[i*chunk:(i+1)*chunk], rmem[i*chunk:(i+1)*chunk]) {
				t.Errorf("wr %d completed successfully but its bytes differ", i)
			}
		case ibv.WCWRFlushErr:
		default:
			t.Errorf("wr %d: %s, want SUCCESS or WR_FLUSH_ERR", i, wc.Status)
		}
	}
	if success == 0 {
		t.Error("no response landed in the flush window: the fault did not delay the flush")
	}
	if wcs[count].Status != ibv.WCWRFlushErr {
		t.Errorf("wr posted after ToError: %s, want WR_FLUSH_ERR", wcs[count].Status)
	}
	clear(lmem)
	time.Sleep(2 * delay)
	for i, b := range lmem {
		if b != 0 {
			t.Fatalf("late byte at %d after the flush completions were polled", i)
		}
	}
}

// TestFaultAsyncFlushDestroy: Destroy during the flush window returns at
// once, flushes every outstanding WR, and no byte lands afterwards.
func TestFaultAsyncFlushDestroy(t *testing.T) {
	const delay = 100 * time.Millisecond
	_, d := newProvider(t)
	d[1].SetFaults(Faults{ResponseDelay: delay})
	d[0].SetFaults(Faults{AsyncFlush: time.Minute})
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 1<<20, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 1<<20, accRead, 2)
	for i := range 4 {
		post(t, req.QP, readWR(uint64(i), lmr, rmr, 0, 1<<20))
	}
	if err := req.QP.ToError(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := req.QP.Destroy(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Destroy took %v during the flush window", took)
	}
	for i, wc := range ibvtest.Collect(t, req.CQ, 4) {
		expect(t, wc, uint64(i), ibv.WCWRFlushErr)
	}
	clear(lmem)
	time.Sleep(3 * delay)
	for i, b := range lmem {
		if b != 0 {
			t.Fatalf("late byte at %d after Destroy", i)
		}
	}
}

// TestFaultDelayWithinBudget: a delay shorter than the retry budget only
// slows READs down.
func TestFaultDelayWithinBudget(t *testing.T) {
	_, d := newProvider(t)
	d[1].SetFaults(Faults{ResponseDelay: 50 * time.Millisecond})
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	rmem, rmr := ibvtest.Region(t, peer, 4096, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 4096, accRead, 2)
	start := time.Now()
	post(t, req.QP, readWR(1, lmr, rmr, 0, 4096), readWR(2, lmr, rmr, 0, 4096))
	wcs := ibvtest.Collect(t, req.CQ, 2)
	expect(t, wcs[0], 1, ibv.WCSuccess)
	expect(t, wcs[1], 2, ibv.WCSuccess)
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("two delayed READs took %v, want ≥ 100ms", took)
	}
	if !bytes.Equal(lmem, rmem) {
		t.Fatal("data differs")
	}
}

// TestFaultDrop: a responder that answers nothing gives RETRY_EXC_ERR after
// the retry budget, and the QP flushes the rest.
func TestFaultDrop(t *testing.T) {
	_, d := newProvider(t)
	d[1].SetFaults(Faults{DropResponses: true})
	attr := ibv.DefaultConnectAttr()
	attr.Timeout = 12 // 16.8ms per try, 134ms budget
	req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
	peer := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	ibvtest.Connect(t, req, peer, attr)
	_, rmr := ibvtest.Region(t, peer, 4096, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 4096, accRead, 2)
	clear(lmem)
	start := time.Now()
	post(t, req.QP, readWR(1, lmr, rmr, 0, 4096), readWR(2, lmr, rmr, 0, 4096))
	wcs := ibvtest.Collect(t, req.CQ, 2)
	took := time.Since(start)
	expect(t, wcs[0], 1, ibv.WCRetryExcErr)
	expect(t, wcs[1], 2, ibv.WCWRFlushErr)
	if b := attr.RetryBudget(); took < b || took > b+time.Second {
		t.Fatalf("RETRY_EXC_ERR after %v, want in [%v, %v]", took, b, b+time.Second)
	}
	if !bytes.Equal(lmem, make([]byte, 4096)) {
		t.Fatal("dropped READ wrote memory")
	}
}

// TestFaultCut: cutting the connections with READs in flight fails them
// with RETRY_EXC_ERR; cutting an idle connection is transparent (the next
// WR redials, as an RC QP rides out a link flap).
func TestFaultCut(t *testing.T) {
	for _, cutSide := range []int{0, 1} {
		t.Run([]string{"requester", "responder"}[cutSide], func(t *testing.T) {
			_, d := newProvider(t)
			req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
			rmem, rmr := ibvtest.Region(t, peer, 1<<20, accRead, 1)
			lmem, lmr := ibvtest.Region(t, req, 1<<20, accRead, 2)
			post(t, req.QP, readWR(1, lmr, rmr, 0, 1<<20))
			expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)

			d[cutSide].CutConnections() // idle: transparent once noticed
			time.Sleep(50 * time.Millisecond)
			clear(lmem)
			post(t, req.QP, readWR(2, lmr, rmr, 0, 1<<20))
			expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 2, ibv.WCSuccess)
			if !bytes.Equal(lmem, rmem) {
				t.Fatal("data differs after idle cut")
			}

			d[1].SetFaults(Faults{ResponseDelay: time.Second})
			post(t, req.QP, readWR(3, lmr, rmr, 0, 1<<20), readWR(4, lmr, rmr, 0, 1<<20))
			time.Sleep(100 * time.Millisecond)
			d[cutSide].CutConnections() // in flight: error
			wcs := ibvtest.Collect(t, req.CQ, 2)
			expect(t, wcs[0], 3, ibv.WCRetryExcErr)
			expect(t, wcs[1], 4, ibv.WCWRFlushErr)
			if st := req.QP.State(); st != ibv.QPSError {
				t.Fatalf("state %s after cut", st)
			}
		})
	}
}

// TestHelloMismatch: a QP connected to a peer QP that is connected to
// someone else is rejected (no cross-talk through a stale or foreign
// endpoint) and ends in RETRY_EXC_ERR.
func TestHelloMismatch(t *testing.T) {
	_, d := newProvider(t)
	attr := ibv.DefaultConnectAttr()
	attr.Timeout = 12
	legit, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 4096, accRead, 1)
	_ = legit
	// Same device address and target QPN, but another source QP.
	intruder := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
	if err := intruder.QP.Connect(peer.QP.Endpoint(), attr); err != nil {
		t.Fatal(err)
	}
	_, lmr := ibvtest.Region(t, intruder, 4096, accRead, 2)
	post(t, intruder.QP, readWR(1, lmr, rmr, 0, 4096))
	expect(t, ibvtest.Collect(t, intruder.CQ, 1)[0], 1, ibv.WCRetryExcErr)

	// A raw hello from the right QPN but the wrong address is refused too.
	ep := legit.QP.Endpoint()
	c, err := net.Dial("tcp", d[1].Info().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(appendHello(nil, ep.QPN, peer.QP.QPN(), ep.PSN, ep.GID, peer.QP.Endpoint().Secret, d[2].Info().Addr)); err != nil {
		t.Fatal(err)
	}
	var buf [16]byte
	m, err := readFrame(c, buf[:])
	if err != nil || m.typ != tHelloAck || m.status != stMismatch {
		t.Fatalf("hello from wrong address: %+v, %v; want mismatch", m, err)
	}
}

// TestGarbageConnection: junk on the data port is dropped without harm.
func TestGarbageConnection(t *testing.T) {
	_, d := newProvider(t)
	for _, junk := range [][]byte{
		{0xff, 0xff, 0xff, 0xff, 1}, // huge length
		{0, 0, 0, 1, 99},            // unknown type
		func() []byte { // hello whose address length overruns the body
			h := appendHello(nil, 1, peerQPNStart, 3, [16]byte{}, [16]byte{}, "abc")
			h[len(h)-4] = 200
			return h
		}(),
	} {
		c, err := net.Dial("tcp", d[1].Info().Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if _, err := c.Read(b[:]); err == nil {
			t.Fatalf("junk %x got an answer", junk)
		}
		c.Close()
	}
	// The device still works.
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 4096, accRead, 1)
	_, lmr := ibvtest.Region(t, req, 4096, accRead, 2)
	post(t, req.QP, readWR(1, lmr, rmr, 0, 4096))
	expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)
}

// TestDeregWhileServing: deregistering the remote MR while READs are being
// served is safe and later READs get REM_ACCESS_ERR.
func TestDeregWhileServing(t *testing.T) {
	_, d := newProvider(t)
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 4<<20, accRead, 1)
	_, lmr := ibvtest.Region(t, req, 4<<20, accRead, 2)
	const count = 32
	for i := range count {
		post(t, req.QP, readWR(uint64(i), lmr, rmr, 0, 4<<20))
	}
	time.Sleep(5 * time.Millisecond)
	if err := rmr.Dereg(); err != nil {
		t.Fatal(err)
	}
	wcs := ibvtest.Collect(t, req.CQ, count)
	last := wcs[len(wcs)-1].Status
	if last != ibv.WCRemAccessErr && last != ibv.WCWRFlushErr {
		t.Fatalf("last READ after dereg: %s", last)
	}
}

// TestLateResponder: the requester posts before the remote QP reached RTR;
// as with verbs, it keeps retrying and succeeds once the remote connects
// within the retry budget.
func TestLateResponder(t *testing.T) {
	_, d := newProvider(t)
	req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
	peer := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	rmem, rmr := ibvtest.Region(t, peer, 4096, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 4096, accRead, 2)
	attr := ibv.DefaultConnectAttr()
	if err := req.QP.Connect(peer.QP.Endpoint(), attr); err != nil {
		t.Fatal(err)
	}
	post(t, req.QP, readWR(1, lmr, rmr, 0, 4096))
	time.Sleep(attr.RetryBudget() / 4)
	if err := peer.QP.Connect(req.QP.Endpoint(), attr); err != nil {
		t.Fatal(err)
	}
	expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)
	if !bytes.Equal(lmem, rmem) {
		t.Fatal("data differs")
	}
}

// TestCloseWithOutstanding: closing the provider with READs in flight
// flushes them, returns promptly, leaves no goroutine (goleak) and never
// touches the memory afterwards.
func TestCloseWithOutstanding(t *testing.T) {
	p, d := newProvider(t)
	d[1].SetFaults(Faults{ResponseDelay: 20 * time.Millisecond})
	req, peer := ibvtest.Pair(t, d[0], d[1], ibvtest.DefaultCap())
	_, rmr := ibvtest.Region(t, peer, 1<<20, accRead, 1)
	lmem, lmr := ibvtest.Region(t, req, 1<<20, accRead, 2)
	for i := range 32 {
		post(t, req.QP, readWR(uint64(i), lmr, rmr, 0, 1<<20))
	}
	time.Sleep(30 * time.Millisecond)
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("close took %v", took)
	}
	clear(lmem)
	time.Sleep(100 * time.Millisecond)
	for i, b := range lmem {
		if b != 0 {
			t.Fatalf("byte %d written after Close", i)
		}
	}
	if st := req.QP.State(); st != ibv.QPSError {
		t.Fatalf("QP state after close %s", st)
	}
}

// TestStressRandomFaults reuses one local buffer across many QPs, each hit
// by a random fault while READs are in flight (none, ToError, Destroy, a
// cut on either side, a delay). Every WR must complete exactly once and in
// order, every success must carry the right bytes, and once the
// completions are drained no byte may land in the reused buffer.
func TestStressRandomFaults(t *testing.T) {
	const slots, slot = 16, 256 << 10
	_, d := newProvider(t)
	peer := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	rmem, rmr := ibvtest.Region(t, peer, slots*slot, accRead, 1)
	lmem := ibvtest.MapMemory(t, slots*slot)
	rng := rand.New(rand.NewPCG(7, 7))
	for iter := range 24 {
		fault := rng.IntN(6)
		d[1].SetFaults(Faults{})
		if fault == 5 {
			d[1].SetFaults(Faults{ResponseDelay: 5 * time.Millisecond})
		}
		req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
		lmr, err := req.PD.RegMR(lmem, accRead)
		if err != nil {
			t.Fatal(err)
		}
		// A responder QP per requester QP, in the PD of the remote MR.
		rq, err := peer.PD.CreateQP(peer.CQ, ibvtest.DefaultCap())
		if err != nil {
			t.Fatal(err)
		}
		pq := &ibvtest.Side{Dev: d[1], PD: peer.PD, CQ: peer.CQ, QP: rq}
		ibvtest.Connect(t, req, pq, ibvtest.PairAttr())

		var wrs []ibv.SendWR
		for i := range slots {
			n := uint32(1 + rng.IntN(slot))
			off := uint64(i * slot)
			wrs = append(wrs, ibv.SendWR{ID: uint64(i), Op: ibv.OpRDMARead, Signaled: true,
				LocalAddr: lmr.Addr() + off, Length: n, LKey: lmr.LKey(),
				RemoteAddr: rmr.Addr() + uint64(rng.IntN(slots*slot-int(n)+1)), RKey: rmr.RKey()})
		}
		post(t, req.QP, wrs...)
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		switch fault {
		case 1:
			req.QP.ToError()
		case 2:
			req.QP.Destroy()
		case 3:
			d[0].CutConnections()
		case 4:
			d[1].CutConnections()
		}
		wcs := ibvtest.Collect(t, req.CQ, slots)
		failed := false
		for i, wc := range wcs {
			w := wrs[i]
			if wc.ID != w.ID {
				t.Fatalf("iter %d fault %d: completion %d is wr %d", iter, fault, i, wc.ID)
			}
			switch {
			case wc.Status == ibv.WCSuccess:
				if failed {
					t.Fatalf("iter %d: success after a failure", iter)
				}
				off, roff := w.LocalAddr-lmr.Addr(), w.RemoteAddr-rmr.Addr()
				if !bytes.Equal(lmem[off:off+uint64(w.Length)], rmem[roff:roff+uint64(w.Length)]) {
					t.Fatalf("iter %d fault %d: wrong data for wr %d", iter, fault, i)
				}
			case fault == 0 || fault == 5:
				t.Fatalf("iter %d: %s without a fault", iter, wc.Status)
			default:
				failed = true
			}
		}
		req.QP.ToError() // drain done: nothing may land any more
		for i := range lmem {
			lmem[i] = byte(iter)
		}
		time.Sleep(5 * time.Millisecond)
		for i, b := range lmem {
			if b != byte(iter) {
				t.Fatalf("iter %d fault %d: late byte at %d", iter, fault, i)
			}
		}
		req.QP.Destroy()
		rq.Destroy()
		lmr.Dereg()
	}
}

// TestMisbehavingResponder: a fake responder that answers out of order or
// with garbage fails the requester QP cleanly (BAD_RESP_ERR, or
// RETRY_EXC_ERR for a broken stream) without touching memory.
func TestMisbehavingResponder(t *testing.T) {
	tests := []struct {
		name  string
		reply func(seqs [2]uint64) []byte
		want  ibv.WCStatus
	}{
		{"out_of_order", func(s [2]uint64) []byte { return appendReadResp(nil, s[1], stOK, 0, 0) }, ibv.WCBadRespErr},
		{"unknown_seq", func(s [2]uint64) []byte { return appendReadResp(nil, 999, stOK, 0, 0) }, ibv.WCBadRespErr},
		{"wrong_type", func(s [2]uint64) []byte { return appendWriteAck(nil, s[0], stOK) }, ibv.WCBadRespErr},
		{"too_long", func(s [2]uint64) []byte { return append(appendReadResp(nil, s[0], stOK, 0, 20), make([]byte, 20)...) }, ibv.WCBadRespErr},
		{"garbage", func([2]uint64) []byte { return []byte{0xff, 0xff, 0xff, 0xff, 0} }, ibv.WCRetryExcErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := newProvider(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan struct{})
			go func() {
				defer close(served)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, maxBody)
				if m, err := readFrame(c, buf); err != nil || m.typ != tHello {
					return
				}
				c.Write(appendHelloAck(nil, stOK))
				var seqs [2]uint64
				for i := range seqs {
					m, err := readFrame(c, buf)
					if err != nil {
						return
					}
					seqs[i] = m.seq
				}
				c.Write(tc.reply(seqs))
				readFrame(c, buf) // until the requester closes
			}()
			req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
			lmem, lmr := ibvtest.Region(t, req, 4096, accRead, 1)
			clear(lmem)
			if err := req.QP.Connect(ibv.Endpoint{QPN: 1, Addr: ln.Addr().String()}, ibvtest.PairAttr()); err != nil {
				t.Fatal(err)
			}
			post(t, req.QP,
				ibv.SendWR{ID: 1, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 10, LKey: lmr.LKey()},
				ibv.SendWR{ID: 2, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: lmr.Addr(), Length: 10, LKey: lmr.LKey()})
			wcs := ibvtest.Collect(t, req.CQ, 2)
			expect(t, wcs[0], 1, tc.want)
			expect(t, wcs[1], 2, ibv.WCWRFlushErr)
			if !bytes.Equal(lmem, make([]byte, 4096)) {
				t.Fatal("memory touched")
			}
			<-served
		})
	}
}
