package tcp

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// newGatedDevice is one device with the given pre-hello limits and a
// private metrics set, closed at cleanup.
func newGatedDevice(t *testing.T, maxTotal, perSource int) (*Device, *metrics.Metrics) {
	t.Helper()
	met := metricstest.New()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	p, err := NewProvider(DeviceOptions{Name: "holder", Logger: &log, Metrics: met,
		MaxPreHello: maxTotal, MaxPreHelloPerSource: perSource})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	d, err := p.Open("holder")
	if err != nil {
		t.Fatal(err)
	}
	return d.(*Device), met
}

// hostileHello dials addr and sends the prefix of a hello announcing a
// body of n bytes, then a few body bytes, and never the rest: what an
// attacker does to make the holder reserve a buffer of n bytes.
func hostileHello(t *testing.T, addr string, n uint32) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var pre [prefixLen + 8]byte
	binary.BigEndian.PutUint32(pre[:], n)
	pre[4] = tHello
	if _, err := c.Write(pre[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestPreHelloMemoryBounded (issue 14.1): connections that announce a
// hello and never finish it hold no frame buffer: one announcing a frame
// longer than any hello is dropped at once, one announcing a hello-sized
// frame waits with a hello-sized buffer. Before the fix each took a 1 MiB
// buffer for the 5 s hello timeout (64 MiB here).
func TestPreHelloMemoryBounded(t *testing.T) {
	const conns = 64
	d, met := newGatedDevice(t, 1024, 1024)
	before := heapInuse()
	for i := range conns {
		n := uint32(maxBody)
		if i%2 == 0 {
			n = maxHelloBody
		}
		hostileHello(t, d.Info().Addr, n)
	}
	waitFor(t, "hostile connections accepted", 5*time.Second, func() bool {
		return d.gate.Waiting()+int(metrics.Value(met.TCPDataRefused.WithLabelValues(refusedBadHello))) == conns
	})
	time.Sleep(50 * time.Millisecond) // let every responder block in its read
	grew := int64(heapInuse()) - int64(before)
	if grew > 8<<20 {
		t.Fatalf("%d pre-hello connections grew the heap by %d MiB, want < 8", conns, grew>>20)
	}
}

// TestPreHelloGate (issue 14.1): pre-hello connections are capped per
// source and in total by evicting the oldest, every drop is counted, and a
// real requester still gets through a flood from its own address.
func TestPreHelloGate(t *testing.T) {
	const perSource = 4
	d, met := newGatedDevice(t, 64, perSource)
	var hostile []net.Conn
	for range 3 * perSource {
		hostile = append(hostile, hostileHello(t, d.Info().Addr, maxHelloBody))
	}
	waitFor(t, "evictions", 5*time.Second, func() bool {
		return metrics.Value(met.TCPDataRefused.WithLabelValues(refusedSourceLimit)) == 2*perSource
	})
	if n := d.gate.Waiting(); n != perSource {
		t.Fatalf("%d connections wait for a hello, want %d", n, perSource)
	}
	// The oldest were dropped: they read EOF, the newest are still open.
	for i, c := range hostile {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		evicted := err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
		if want := i < 2*perSource; evicted != want {
			t.Fatalf("connection %d evicted=%v (%v), want %v", i, evicted, err, want)
		}
	}

	// A real requester (same source address) reads through the flood.
	_, others := newProvider(t)
	req, peer := ibvtest.NewSide(t, others[0], ibvtest.DefaultCap()), ibvtest.NewSide(t, d, ibvtest.DefaultCap())
	ibvtest.Connect(t, req, peer, ibvtest.PairAttr())
	_, rmr := ibvtest.Region(t, peer, 1<<20, accRead, 1)
	_, lmr := ibvtest.Region(t, req, 1<<20, accRead, 2)
	post(t, req.QP, readWR(1, lmr, rmr, 0, 1<<20))
	expect(t, ibvtest.Collect(t, req.CQ, 1)[0], 1, ibv.WCSuccess)

	// A bad first frame is counted too.
	c, err := net.Dial("tcp", d.Info().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(appendReadReq(nil, 1, 0, 0, 1))
	waitFor(t, "bad hello counted", 5*time.Second, func() bool {
		return metrics.Value(met.TCPDataRefused.WithLabelValues(refusedBadHello)) == 1
	})
}

// stallingPeer is a fake remote device that admits one connection, acks
// its hello, reads up to readFirst bytes and then reads nothing more, the
// connection staying open: a peer whose process hangs.
func stallingPeer(t *testing.T, readFirst int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stop := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if m, err := readHello(c); err != nil || m.typ != tHello {
			return
		}
		if _, err := c.Write(appendHelloAck(nil, stOK)); err != nil {
			return
		}
		_, _ = io.CopyN(io.Discard, c, int64(readFirst))
		<-stop
	}()
	return ln.Addr().String()
}

// TestStalledResponderFailsWrite (issue 14.2): a remote that accepts the
// hello and stops reading fails a large WRITE with RETRY_EXC_ERR about one
// retry budget after it took its last byte, and the QP goes to ERROR.
// Before the fix the sender blocked in the socket write forever.
func TestStalledResponderFailsWrite(t *testing.T) {
	_, d := newProvider(t)
	addr := stallingPeer(t, 1<<20)
	attr := ibv.DefaultConnectAttr()
	attr.Timeout = 13 // 268 ms budget
	budget := attr.RetryBudget()
	req := ibvtest.NewSide(t, d[0], ibvtest.DefaultCap())
	const size = 64 << 20
	_, lmr := ibvtest.Region(t, req, size, accRead, 1)
	if err := req.QP.Connect(ibv.Endpoint{QPN: 1, Addr: addr}, attr); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	post(t, req.QP, ibv.SendWR{ID: 7, Op: ibv.OpRDMAWrite, Signaled: true,
		LocalAddr: lmr.Addr(), Length: size, LKey: lmr.LKey(), RemoteAddr: 0x1000, RKey: 1})
	wc := ibvtest.Collect(t, req.CQ, 1)[0]
	expect(t, wc, 7, ibv.WCRetryExcErr)
	if took := time.Since(start); took > budget+3*time.Second {
		t.Fatalf("RETRY_EXC_ERR after %v, want within about one budget (%v)", took, budget)
	}
	if st := req.QP.State(); st != ibv.QPSError {
		t.Fatalf("QP state %s, want ERROR", st)
	}
}

// TestStalledRequesterDropped (issue 14.3): a requester that asks for a
// large READ and stops reading does not pin the holder's responder: its
// connection is closed about one retry budget later (it reads EOF after
// what was buffered, not the whole response) and the holder's QP shows no
// open data connection. Before the fix the responder blocked forever and
// sent everything once the requester read again.
func TestStalledRequesterDropped(t *testing.T) {
	_, d := newProvider(t)
	holder := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	const size = 32 << 20
	_, rmr := ibvtest.Region(t, holder, size, accRead, 1)
	c := fakeRequester(t, d[1], holder)
	if _, err := c.Write(appendReadReq(nil, 1, rmr.Addr(), rmr.RKey(), size)); err != nil {
		t.Fatal(err)
	}
	q := holder.QP.(*qp)
	waitFor(t, "holder drops the stalled requester", 5*time.Second, func() bool {
		open, _, _ := q.DataActivity()
		return open == 0
	})
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("reading what was buffered: %v", err)
	}
	if n >= size {
		t.Fatalf("got the whole %d-byte response after stalling; want the connection dropped", n)
	}
}

// fakeRequester connects holder's QP (on dev) to a made-up endpoint and
// dials dev's data port as that endpoint, hello acknowledged: a requester
// whose every byte the test writes. The holder's retry budget is 268 ms.
func fakeRequester(t *testing.T, dev *Device, holder *ibvtest.Side) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fakeAddr := ln.Addr().String()
	ln.Close() // only the address is needed: the holder never dials it
	attr := ibv.DefaultConnectAttr()
	attr.Timeout = 13 // 268 ms budget
	remote := ibv.Endpoint{QPN: 77, PSN: 5, Addr: fakeAddr}
	if err := holder.QP.Connect(remote, attr); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", dev.Info().Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hello := appendHello(nil, remote.QPN, holder.QP.QPN(), remote.PSN, ibv.GID{}, holder.QP.Endpoint().Secret, fakeAddr)
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	var buf [16]byte
	if m, err := readFrame(c, buf[:]); err != nil || m.status != stOK {
		t.Fatalf("hello: %+v, %v", m, err)
	}
	return c
}

// TestStalledRequestFrameDropped (issue 14.3): a requester that starts a
// request frame (a WRITE announcing a full chunk, which makes the holder
// take a frame buffer) and stops sending mid-frame is dropped after about
// one retry budget. Idle between frames stays allowed.
func TestStalledRequestFrameDropped(t *testing.T) {
	_, d := newProvider(t)
	holder := ibvtest.NewSide(t, d[1], ibvtest.DefaultCap())
	c := fakeRequester(t, d[1], holder)
	q := holder.QP.(*qp)
	time.Sleep(500 * time.Millisecond) // idle, more than a budget: still connected
	if open, _, _ := q.DataActivity(); open != 1 {
		t.Fatalf("idle requester dropped (%d connections open)", open)
	}
	frame := appendWriteReq(nil, 1, 0x1000, 1, chunkSize, 0, chunkSize)
	if _, err := c.Write(append(frame, make([]byte, chunkSize/2)...)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "holder drops the requester stalled mid-frame", 5*time.Second, func() bool {
		open, _, _ := q.DataActivity()
		return open == 0
	})
	t.Logf("dropped %v after the stall", time.Since(start).Round(time.Millisecond))
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
