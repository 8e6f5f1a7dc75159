// Package ibvtest is the conformance suite of the ibv model: the same tests
// run against every provider that has devices (the tcp provider everywhere,
// verbs on RDMA hosts), so both behave like an RC queue pair.
//
// It owns only test helpers; it must never depend on a particular provider.
package ibvtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Env is what one conformance test needs: a requester device and two peer
// devices, fresh for the test and released by the caller's t.Cleanup. On an
// RDMA host with one HCA the three may be the same device (QPs connected in
// loopback); the tcp provider gives three devices, the peers sharing a
// QPNStart so that their QPNs collide.
//
// Every QP, MR and CQ the suite creates is released by t.Cleanup, and a QP
// may be destroyed twice (once by a test, once at cleanup): providers must
// return an error, not crash, on the second Destroy.
type Env struct {
	Requester ibv.Device
	Peer1     ibv.Device
	Peer2     ibv.Device
	// SameQPNs: the provider was told to make Peer1 and Peer2 allocate
	// identical QPNs (the suite then asserts that they do).
	SameQPNs bool
}

// completionTimeout bounds every wait for a completion.
const completionTimeout = 30 * time.Second

// Run runs the suite; newEnv is called once per subtest.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, env Env)
	}{
		{"ReadWriteSizes", testReadWriteSizes},
		{"ChainOrder", testChainOrder},
		{"Unsignaled", testUnsignaled},
		{"Errors", testErrors},
		{"DeadPeer", testDeadPeer},
		{"States", testStates},
		{"QueueFull", testQueueFull},
		{"MaxRdAtomic", testMaxRdAtomic},
		{"DestroyOutstanding", testDestroyOutstanding},
		{"ToErrorDrain", testToErrorDrain},
		{"IdenticalQPNs", testIdenticalQPNs},
		{"CQ", testCQ},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newEnv(t)) })
	}
}

// MapMemory returns n bytes of anonymous mmap'd memory (not owned by the Go
// GC), unmapped at cleanup. Register MRs over it after calling MapMemory so
// that their Dereg cleanup runs first.
func MapMemory(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() {
		if err := unix.Munmap(b); err != nil {
			t.Errorf("munmap: %v", err)
		}
	})
	return b
}

// Side is one end of a connection under test.
type Side struct {
	Dev ibv.Device
	PD  ibv.PD
	CQ  ibv.CQ
	QP  ibv.QP
}

// NewSide allocates a PD, a CQ and a QP in INIT on dev.
func NewSide(t testing.TB, dev ibv.Device, qc ibv.QPCap) *Side {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("alloc pd: %v", err)
	}
	t.Cleanup(func() { pd.Close() })
	cq, err := dev.CreateCQ(max(qc.MaxSendWR*2, 16))
	if err != nil {
		t.Fatalf("create cq: %v", err)
	}
	t.Cleanup(func() { cq.Close() })
	qp, err := pd.CreateQP(cq, qc)
	if err != nil {
		t.Fatalf("create qp: %v", err)
	}
	t.Cleanup(func() { qp.Destroy() })
	if st := qp.State(); st != ibv.QPSInit {
		t.Fatalf("new QP state %s, want INIT", st)
	}
	return &Side{Dev: dev, PD: pd, CQ: cq, QP: qp}
}

// DefaultCap is the QP size the suite uses unless a test needs another.
func DefaultCap() ibv.QPCap {
	return ibv.QPCap{MaxSendWR: 256, MaxRecvWR: 1, MaxSendSGE: 1, MaxRdAtomic: 16}
}

// Connect connects a and b to each other (b first, as a holder does when
// answering a handshake).
func Connect(t testing.TB, a, b *Side, attr ibv.ConnectAttr) {
	t.Helper()
	if err := b.QP.Connect(a.QP.Endpoint(), attr); err != nil {
		t.Fatalf("connect responder: %v", err)
	}
	if err := a.QP.Connect(b.QP.Endpoint(), attr); err != nil {
		t.Fatalf("connect requester: %v", err)
	}
	for _, s := range []*Side{a, b} {
		if st := s.QP.State(); st != ibv.QPSRTS {
			t.Fatalf("QP %d state after connect %s, want RTS", s.QP.QPN(), st)
		}
	}
}

// PairAttr is what Pair connects with: the default attributes with a
// longer ACK timeout (268 ms per try, about 2 s in all), so that a software
// provider on a loaded test machine does not report a spurious
// RETRY_EXC_ERR. Tests of the retry budget itself use the defaults.
func PairAttr() ibv.ConnectAttr {
	a := ibv.DefaultConnectAttr()
	a.Timeout = 16
	return a
}

// Pair is a connected requester/peer pair (see PairAttr).
func Pair(t testing.TB, req, peer ibv.Device, qc ibv.QPCap) (*Side, *Side) {
	t.Helper()
	a, b := NewSide(t, req, qc), NewSide(t, peer, DefaultCap())
	Connect(t, a, b, PairAttr())
	return a, b
}

// Region maps n bytes on s, fills them with random bytes and registers them.
func Region(t testing.TB, s *Side, n int, access ibv.Access, seed uint64) ([]byte, ibv.MR) {
	t.Helper()
	mem := MapMemory(t, n)
	Fill(mem, seed)
	mr, err := s.PD.RegMR(mem, access)
	if err != nil {
		t.Fatalf("reg mr: %v", err)
	}
	t.Cleanup(func() { mr.Dereg() })
	return mem, mr
}

// Fill fills b with pseudo-random bytes from seed.
func Fill(b []byte, seed uint64) {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	c := rand.NewChaCha8(s)
	_, _ = c.Read(b)
}

// Collect waits for n completions on cq.
func Collect(t testing.TB, cq ibv.CQ, n int) []ibv.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	out := make([]ibv.WorkCompletion, 0, n)
	buf := make([]ibv.WorkCompletion, 64)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for completion %d of %d: %v (got %v)", len(out)+1, n, err, out)
		}
	}
	return out
}

// ExpectIdle checks that no completion arrives on cq within d.
func ExpectIdle(t testing.TB, cq ibv.CQ, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var buf [4]ibv.WorkCompletion
	for {
		if k, err := cq.Poll(buf[:]); err != nil || k > 0 {
			t.Fatalf("unexpected completions %v (err %v)", buf[:k], err)
		}
		if err := cq.Wait(ctx); err != nil {
			return
		}
	}
}

func post(t testing.TB, qp ibv.QP, wrs ...ibv.SendWR) {
	t.Helper()
	if bad, err := qp.PostSend(wrs); err != nil {
		t.Fatalf("post %d WRs: bad=%d: %v", len(wrs), bad, err)
	}
}

func readWR(id uint64, local ibv.MR, loff uint64, remote ibv.MR, roff uint64, n uint32) ibv.SendWR {
	return ibv.SendWR{ID: id, Op: ibv.OpRDMARead, Signaled: true, LocalAddr: local.Addr() + loff,
		Length: n, LKey: local.LKey(), RemoteAddr: remote.Addr() + roff, RKey: remote.RKey()}
}

func writeWR(id uint64, local ibv.MR, loff uint64, remote ibv.MR, roff uint64, n uint32) ibv.SendWR {
	w := readWR(id, local, loff, remote, roff, n)
	w.Op = ibv.OpRDMAWrite
	return w
}

func expectWC(t testing.TB, wc ibv.WorkCompletion, id uint64, st ibv.WCStatus) {
	t.Helper()
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion wr_id=%d status=%s, want wr_id=%d status=%s", wc.ID, wc.Status, id, st)
	}
}

func equal(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes differ from byte %d on", what, len(want), i)
	}
}

const (
	accAll  = ibv.AccessLocalWrite | ibv.AccessRemoteRead | ibv.AccessRemoteWrite
	mib     = 1 << 20
	slack   = 64 // room for unaligned offsets
	rOffset = 13
	lOffset = 7
)

func testReadWriteSizes(t *testing.T, env Env) {
	sizes := []int{1, 63, 4096, mib + 3, 16 * mib}
	req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
	rmem, rmr := Region(t, peer, 16*mib+slack, accAll, 1)
	lmem, lmr := Region(t, req, 16*mib+slack, accAll, 2)
	for i, n := range sizes {
		t.Run(fmt.Sprintf("read_%d", n), func(t *testing.T) {
			Fill(rmem, uint64(100+i))
			clear(lmem)
			post(t, req.QP, readWR(uint64(i), lmr, lOffset, rmr, rOffset, uint32(n)))
			wc := Collect(t, req.CQ, 1)[0]
			expectWC(t, wc, uint64(i), ibv.WCSuccess)
			if wc.Op != ibv.OpRDMARead || wc.Bytes != uint32(n) || wc.QPN != req.QP.QPN() {
				t.Fatalf("completion %+v: want op READ bytes %d qpn %d", wc, n, req.QP.QPN())
			}
			equal(t, "read data", lmem[lOffset:lOffset+n], rmem[rOffset:rOffset+n])
			if lmem[lOffset-1] != 0 || lmem[lOffset+n] != 0 {
				t.Fatalf("READ wrote outside [%d, %d)", lOffset, lOffset+n)
			}
		})
		t.Run(fmt.Sprintf("write_%d", n), func(t *testing.T) {
			Fill(lmem, uint64(200+i))
			clear(rmem)
			post(t, req.QP, writeWR(uint64(i), lmr, lOffset, rmr, rOffset, uint32(n)))
			wc := Collect(t, req.CQ, 1)[0]
			expectWC(t, wc, uint64(i), ibv.WCSuccess)
			if wc.Op != ibv.OpRDMAWrite || wc.Bytes != uint32(n) {
				t.Fatalf("completion %+v: want op WRITE bytes %d", wc, n)
			}
			equal(t, "written data", rmem[rOffset:rOffset+n], lmem[lOffset:lOffset+n])
			if rmem[rOffset-1] != 0 || rmem[rOffset+n] != 0 {
				t.Fatalf("WRITE wrote outside [%d, %d)", rOffset, rOffset+n)
			}
		})
	}
}

// testChainOrder posts one chain of mixed READs and WRITEs on disjoint
// ranges and checks completion order, wr_ids and data.
func testChainOrder(t *testing.T, env Env) {
	const count, span = 96, 64 << 10
	req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
	rmem, rmr := Region(t, peer, count*span, accAll, 3)
	lmem, lmr := Region(t, req, count*span, accAll, 4)
	want := bytes.Clone(rmem)
	rng := rand.New(rand.NewPCG(5, 6))
	wrs := make([]ibv.SendWR, count)
	for i := range wrs {
		n := uint32(1 + rng.IntN(span))
		off := uint64(i * span)
		id := rng.Uint64()
		if i%3 == 2 {
			wrs[i] = writeWR(id, lmr, off, rmr, off, n)
			copy(want[off:off+uint64(n)], lmem[off:off+uint64(n)])
		} else {
			wrs[i] = readWR(id, lmr, off, rmr, off, n)
		}
	}
	post(t, req.QP, wrs...)
	wcs := Collect(t, req.CQ, count)
	for i, wc := range wcs {
		expectWC(t, wc, wrs[i].ID, ibv.WCSuccess)
		if wc.Op != wrs[i].Op || wc.Bytes != wrs[i].Length {
			t.Fatalf("completion %d: %+v, want op %s bytes %d", i, wc, wrs[i].Op, wrs[i].Length)
		}
	}
	for i, w := range wrs {
		off, n := uint64(i*span), uint64(w.Length)
		if w.Op == ibv.OpRDMARead {
			equal(t, fmt.Sprintf("read %d", i), lmem[off:off+n], rmem[off:off+n])
		}
	}
	equal(t, "remote memory after writes", rmem, want)
	ExpectIdle(t, req.CQ, 20*time.Millisecond)
}

// testUnsignaled: successful unsignaled WRs produce no completion.
func testUnsignaled(t *testing.T, env Env) {
	req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
	rmem, rmr := Region(t, peer, 8*4096, accAll, 7)
	lmem, lmr := Region(t, req, 8*4096, accAll, 8)
	var wrs []ibv.SendWR
	for i := range 8 {
		w := readWR(uint64(i), lmr, uint64(i*4096), rmr, uint64(i*4096), 4096)
		w.Signaled = i == 7
		wrs = append(wrs, w)
	}
	post(t, req.QP, wrs...)
	expectWC(t, Collect(t, req.CQ, 1)[0], 7, ibv.WCSuccess)
	equal(t, "data", lmem, rmem)
	ExpectIdle(t, req.CQ, 20*time.Millisecond)
}

// testErrors covers the completion errors of an RC requester: the failing
// WR gets its status, the QP moves to ERROR, every later WR is flushed, and
// a WR posted afterwards is flushed too (or refused with ErrInvalidState).
func testErrors(t *testing.T, env Env) {
	const n = 4096
	tests := []struct {
		name    string
		rAccess ibv.Access
		bad     func(w *ibv.SendWR, l, r ibv.MR)
		op      ibv.Opcode
		want    ibv.WCStatus
	}{
		{"read_bad_rkey", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.RKey ^= 0x5a5a5a }, ibv.OpRDMARead, ibv.WCRemAccessErr},
		{"read_out_of_bounds", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.RemoteAddr = r.Addr() + r.Len() - n/2 }, ibv.OpRDMARead, ibv.WCRemAccessErr},
		{"read_below_base", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.RemoteAddr = r.Addr() - 1 }, ibv.OpRDMARead, ibv.WCRemAccessErr},
		{"read_no_remote_read", ibv.AccessLocalWrite | ibv.AccessRemoteWrite, func(*ibv.SendWR, ibv.MR, ibv.MR) {}, ibv.OpRDMARead, ibv.WCRemAccessErr},
		{"write_no_remote_write", ibv.AccessLocalWrite | ibv.AccessRemoteRead, func(*ibv.SendWR, ibv.MR, ibv.MR) {}, ibv.OpRDMAWrite, ibv.WCRemAccessErr},
		{"write_bad_rkey", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.RKey ^= 0x5a5a5a }, ibv.OpRDMAWrite, ibv.WCRemAccessErr},
		{"read_bad_lkey", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.LKey ^= 0x5a5a5a }, ibv.OpRDMARead, ibv.WCLocProtErr},
		{"read_local_out_of_bounds", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.LocalAddr = l.Addr() + l.Len() - n/2 }, ibv.OpRDMARead, ibv.WCLocProtErr},
		{"write_bad_lkey", accAll, func(w *ibv.SendWR, l, r ibv.MR) { w.LKey ^= 0x5a5a5a }, ibv.OpRDMAWrite, ibv.WCLocProtErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
			rmem, rmr := Region(t, peer, 4*n, tc.rAccess, 9)
			_, lmr := Region(t, req, 4*n, accAll, 10)
			before := bytes.Clone(rmem)
			mk := func(id uint64) ibv.SendWR {
				w := readWR(id, lmr, 0, rmr, 0, n)
				w.Op = tc.op
				return w
			}
			bad := mk(1)
			tc.bad(&bad, lmr, rmr)
			post(t, req.QP, bad, mk(2), mk(3))
			wcs := Collect(t, req.CQ, 3)
			expectWC(t, wcs[0], 1, tc.want)
			expectWC(t, wcs[1], 2, ibv.WCWRFlushErr)
			expectWC(t, wcs[2], 3, ibv.WCWRFlushErr)
			if st := req.QP.State(); st != ibv.QPSError {
				t.Fatalf("QP state after %s: %s, want ERROR", tc.want, st)
			}
			if tc.op == ibv.OpRDMAWrite {
				equal(t, "remote memory after failed writes", rmem, before)
			}
			// A WR posted on an ERROR QP is flushed (verbs) or refused.
			if _, err := req.QP.PostSend([]ibv.SendWR{mk(4)}); err != nil {
				if !errors.Is(err, ibv.ErrInvalidState) {
					t.Fatalf("post on ERROR QP: %v, want success+flush or ErrInvalidState", err)
				}
			} else {
				expectWC(t, Collect(t, req.CQ, 1)[0], 4, ibv.WCWRFlushErr)
			}
			ExpectIdle(t, req.CQ, 20*time.Millisecond)
		})
	}
}

// retryBound is how long a dead peer may take to produce RETRY_EXC_ERR.
func retryBound(attr ibv.ConnectAttr) time.Duration {
	return 3*attr.RetryBudget() + 2*time.Second
}

// testDeadPeer: a READ toward a destroyed remote QP completes with
// RETRY_EXC_ERR within a bound derived from the retry budget, both on a
// connection that worked before and on one that never carried traffic.
func testDeadPeer(t *testing.T, env Env) {
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			attr := ibv.DefaultConnectAttr()
			req, peer := NewSide(t, env.Requester, DefaultCap()), NewSide(t, env.Peer1, DefaultCap())
			Connect(t, req, peer, attr)
			_, rmr := Region(t, peer, 4096, accAll, 11)
			_, lmr := Region(t, req, 4096, accAll, 12)
			if warm {
				post(t, req.QP, readWR(1, lmr, 0, rmr, 0, 4096))
				expectWC(t, Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)
			}
			if err := peer.QP.Destroy(); err != nil {
				t.Fatalf("destroy peer QP: %v", err)
			}
			start := time.Now()
			post(t, req.QP, readWR(2, lmr, 0, rmr, 0, 4096), readWR(3, lmr, 0, rmr, 0, 4096))
			wcs := Collect(t, req.CQ, 2)
			took := time.Since(start)
			expectWC(t, wcs[0], 2, ibv.WCRetryExcErr)
			expectWC(t, wcs[1], 3, ibv.WCWRFlushErr)
			if b := retryBound(attr); took > b {
				t.Fatalf("RETRY_EXC_ERR after %v, want within %v (budget %v)", took, b, attr.RetryBudget())
			}
			t.Logf("RETRY_EXC_ERR after %v (budget %v)", took, attr.RetryBudget())
			if st := req.QP.State(); st != ibv.QPSError {
				t.Fatalf("QP state %s, want ERROR", st)
			}
		})
	}
}

// testStates walks the QP state machine and checks invalid transitions.
func testStates(t *testing.T, env Env) {
	a, b := NewSide(t, env.Requester, DefaultCap()), NewSide(t, env.Peer1, DefaultCap())
	_, lmr := Region(t, a, 4096, accAll, 13)
	_, rmr := Region(t, b, 4096, accAll, 14)
	if _, err := a.QP.PostSend([]ibv.SendWR{readWR(1, lmr, 0, rmr, 0, 8)}); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("post in INIT: %v, want ErrInvalidState", err)
	}
	Connect(t, a, b, PairAttr())
	if err := a.QP.Connect(b.QP.Endpoint(), ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("second connect: %v, want ErrInvalidState", err)
	}
	post(t, a.QP, readWR(2, lmr, 0, rmr, 0, 8))
	expectWC(t, Collect(t, a.CQ, 1)[0], 2, ibv.WCSuccess)
	if err := a.QP.ToError(); err != nil {
		t.Fatalf("to error: %v", err)
	}
	if st := a.QP.State(); st != ibv.QPSError {
		t.Fatalf("state after ToError %s", st)
	}
	if err := a.QP.Connect(b.QP.Endpoint(), ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("connect from ERROR: %v, want ErrInvalidState", err)
	}
	// An INIT QP may go to ERROR directly.
	c := NewSide(t, env.Requester, DefaultCap())
	if err := c.QP.ToError(); err != nil || c.QP.State() != ibv.QPSError {
		t.Fatalf("INIT→ERROR: %v, state %s", err, c.QP.State())
	}
	if err := c.QP.Connect(b.QP.Endpoint(), ibv.DefaultConnectAttr()); !errors.Is(err, ibv.ErrInvalidState) {
		t.Fatalf("connect from ERROR: %v, want ErrInvalidState", err)
	}
}

// testQueueFull: a chain longer than the send queue is posted up to the
// queue depth; the rest is refused with ErrQueueFull and the bad index.
func testQueueFull(t *testing.T, env Env) {
	qc := DefaultCap()
	qc.MaxSendWR = 4
	req, peer := Pair(t, env.Requester, env.Peer1, qc)
	_, rmr := Region(t, peer, 4096, accAll, 15)
	_, lmr := Region(t, req, 4096, accAll, 16)
	wrs := make([]ibv.SendWR, 512)
	for i := range wrs {
		wrs[i] = readWR(uint64(i), lmr, 0, rmr, 0, 64)
	}
	bad, err := req.QP.PostSend(wrs)
	if !errors.Is(err, ibv.ErrQueueFull) {
		t.Fatalf("post 512 WRs on a 4-deep queue: bad=%d err=%v, want ErrQueueFull", bad, err)
	}
	if bad < qc.MaxSendWR || bad >= len(wrs) {
		t.Fatalf("bad index %d, want in [%d, %d)", bad, qc.MaxSendWR, len(wrs))
	}
	for i, wc := range Collect(t, req.CQ, bad) {
		expectWC(t, wc, uint64(i), ibv.WCSuccess)
	}
	ExpectIdle(t, req.CQ, 20*time.Millisecond)
	// Slots are free again once completions were delivered.
	post(t, req.QP, wrs[:qc.MaxSendWR]...)
	Collect(t, req.CQ, qc.MaxSendWR)
}

// testMaxRdAtomic: more READs than max_rd_atomic are queued, not refused.
func testMaxRdAtomic(t *testing.T, env Env) {
	const count, n = 64, 64 << 10
	qc := DefaultCap()
	qc.MaxRdAtomic = 1
	req, peer := NewSide(t, env.Requester, qc), NewSide(t, env.Peer1, DefaultCap())
	attr := PairAttr()
	attr.MaxRdAtomic = 1
	Connect(t, req, peer, attr)
	rmem, rmr := Region(t, peer, count*n, accAll, 17)
	lmem, lmr := Region(t, req, count*n, accAll, 18)
	var wrs []ibv.SendWR
	for i := range count {
		wrs = append(wrs, readWR(uint64(i), lmr, uint64(i*n), rmr, uint64(i*n), n))
	}
	post(t, req.QP, wrs...)
	for i, wc := range Collect(t, req.CQ, count) {
		expectWC(t, wc, uint64(i), ibv.WCSuccess)
	}
	equal(t, "data", lmem, rmem)
}

// outstandingReads posts count 1 MiB READs into lmr.
func outstandingReads(t *testing.T, req *Side, lmr, rmr ibv.MR, count int) {
	t.Helper()
	var wrs []ibv.SendWR
	for i := range count {
		wrs = append(wrs, readWR(uint64(i), lmr, uint64(i%4)*mib, rmr, 0, mib))
	}
	post(t, req.QP, wrs...)
}

// checkQuiet fills mem with a sentinel and checks nothing overwrites it.
func checkQuiet(t *testing.T, mem []byte) {
	t.Helper()
	for i := range mem {
		mem[i] = 0xAA
	}
	time.Sleep(200 * time.Millisecond)
	for i, b := range mem {
		if b != 0xAA {
			t.Fatalf("byte %d changed to %#x after the QP was flushed", i, b)
		}
	}
}

// testDestroyOutstanding: destroying a QP with READs in flight is safe and
// no byte lands in local memory afterwards.
func testDestroyOutstanding(t *testing.T, env Env) {
	req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
	_, rmr := Region(t, peer, mib, accAll, 19)
	lmem, lmr := Region(t, req, 4*mib, accAll, 20)
	outstandingReads(t, req, lmr, rmr, 64)
	// Destroy once data is flowing, with most READs still outstanding.
	expectWC(t, Collect(t, req.CQ, 1)[0], 0, ibv.WCSuccess)
	if err := req.QP.Destroy(); err != nil {
		t.Fatalf("destroy with outstanding WRs: %v", err)
	}
	checkQuiet(t, lmem)
}

// testToErrorDrain: after ToError and draining its completions (each WR
// completes exactly once, success or flush), no late byte lands.
func testToErrorDrain(t *testing.T, env Env) {
	req, peer := Pair(t, env.Requester, env.Peer1, DefaultCap())
	_, rmr := Region(t, peer, mib, accAll, 21)
	lmem, lmr := Region(t, req, 4*mib, accAll, 22)
	const count = 64
	outstandingReads(t, req, lmr, rmr, count)
	// Move to ERROR once data is flowing, with most READs outstanding.
	first := Collect(t, req.CQ, 1)
	if err := req.QP.ToError(); err != nil {
		t.Fatalf("to error: %v", err)
	}
	flushed := 0
	for i, wc := range append(first, Collect(t, req.CQ, count-1)...) {
		if wc.ID != uint64(i) || (wc.Status != ibv.WCSuccess && wc.Status != ibv.WCWRFlushErr) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
		if wc.Status == ibv.WCWRFlushErr {
			flushed++
		} else if flushed > 0 {
			t.Fatalf("success after a flush at %d", i)
		}
	}
	t.Logf("%d of %d READs flushed", flushed, count)
	checkQuiet(t, lmem)
	ExpectIdle(t, req.CQ, 20*time.Millisecond)
}

// testIdenticalQPNs: one requester reads concurrently from two peers whose
// QPs (may) have the same QPN; each QP gets its own peer's data.
func testIdenticalQPNs(t *testing.T, env Env) {
	const size = 2 * mib
	r1, p1 := Pair(t, env.Requester, env.Peer1, DefaultCap())
	r2, p2 := Pair(t, env.Requester, env.Peer2, DefaultCap())
	if env.SameQPNs && p1.QP.QPN() != p2.QP.QPN() {
		t.Fatalf("peer QPNs %d and %d, want identical", p1.QP.QPN(), p2.QP.QPN())
	}
	t.Logf("peer QPNs %#x %#x, requester QPNs %#x %#x", p1.QP.QPN(), p2.QP.QPN(), r1.QP.QPN(), r2.QP.QPN())
	m1, mr1 := Region(t, p1, size, accAll, 23)
	m2, mr2 := Region(t, p2, size, accAll, 24)
	l1, lmr1 := Region(t, r1, size, accAll, 25)
	l2, lmr2 := Region(t, r2, size, accAll, 26)
	errc := make(chan error, 2)
	run := func(s *Side, lmem, rmem []byte, lmr, rmr ibv.MR, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed))
		for round := range 20 {
			var wrs []ibv.SendWR
			for i := range 8 {
				n := 1 + rng.IntN(size/8)
				off := uint64(i * size / 8)
				wrs = append(wrs, readWR(uint64(round*8+i), lmr, off, rmr, off, uint32(n)))
			}
			if _, err := s.QP.PostSend(wrs); err != nil {
				errc <- err
				return
			}
			wcs, err := collectErr(s.CQ, len(wrs))
			if err != nil {
				errc <- err
				return
			}
			for i, wc := range wcs {
				w := wrs[i]
				if wc.ID != w.ID || wc.Status != ibv.WCSuccess {
					errc <- fmt.Errorf("qpn %d: completion %+v for wr %d", s.QP.QPN(), wc, w.ID)
					return
				}
				off := w.LocalAddr - lmr.Addr()
				if !bytes.Equal(lmem[off:off+uint64(w.Length)], rmem[off:off+uint64(w.Length)]) {
					errc <- fmt.Errorf("qpn %d: wrong data for wr %d", s.QP.QPN(), w.ID)
					return
				}
			}
		}
		errc <- nil
	}
	go run(r1, l1, m1, lmr1, mr1, 1)
	go run(r2, l2, m2, lmr2, mr2, 2)
	// Both readers must be done before failing: cleanup unmaps memory.
	var errs []error
	for range 2 {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
}

func collectErr(cq ibv.CQ, n int) ([]ibv.WorkCompletion, error) {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	out := make([]ibv.WorkCompletion, 0, n)
	buf := make([]ibv.WorkCompletion, 16)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			return out, err
		}
		out = append(out, buf[:k]...)
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// testCQ: Wait honours its context and a closed CQ.
func testCQ(t *testing.T, env Env) {
	cq, err := env.Requester.CreateCQ(16)
	if err != nil {
		t.Fatalf("create cq: %v", err)
	}
	var buf [4]ibv.WorkCompletion
	if k, err := cq.Poll(buf[:]); k != 0 || err != nil {
		t.Fatalf("poll empty CQ: %d, %v", k, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on idle CQ: %v, want deadline exceeded", err)
	}
	done := make(chan error, 1)
	go func() { done <- cq.Wait(context.Background()) }()
	time.Sleep(10 * time.Millisecond)
	if err := cq.Close(); err != nil {
		t.Fatalf("close cq: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ibv.ErrClosed) {
			t.Fatalf("wait on closed CQ: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Wait did not return after Close")
	}
}
