package localdata

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	pegadtest "github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	st   *store.Store
	srv  *Server
	path string
	reg  *prometheus.Registry
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, func(l net.Listener) net.Listener { return l })
}

// newFixtureWith serves on wrap(the listener), after setup (if any) saw
// the server.
func newFixtureWith(t *testing.T, wrap func(net.Listener) net.Listener, setup ...func(*Server)) *fixture {
	t.Helper()
	return newFixtureOn(t, pool.Options{Size: 1 << 20, Log: zerolog.Nop()}, wrap, setup...)
}

// newFixtureOn is newFixtureWith over a pool made with popts.
func newFixtureOn(t *testing.T, popts pool.Options, wrap func(net.Listener) net.Listener, setup ...func(*Server)) *fixture {
	t.Helper()
	p, err := pool.New(popts)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(p, nil)
	reg := prometheus.NewRegistry()
	srv := New(Options{Store: st, LeaseTimeout: time.Minute, MaxLeases: 4, HelloTimeout: 200 * time.Millisecond,
		Metrics: reg, Log: zerolog.Nop()})
	for _, f := range setup {
		f(srv)
	}
	path := filepath.Join(pegadtest.ShortTempDir(t), "d.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(wrap(l)) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		_ = p.Close()
	})
	return &fixture{st: st, srv: srv, path: path, reg: reg}
}

// rawConn speaks the wire protocol by hand.
type rawConn struct {
	t     *testing.T
	c     *net.UnixConn
	r     *bufio.Reader
	seq   uint32
	hello localwire.HelloReply // what the daemon answered to HELLO
}

func (f *fixture) dial(t *testing.T, hello bool) *rawConn {
	t.Helper()
	nc, err := net.Dial("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	rc := &rawConn{t: t, c: nc.(*net.UnixConn)}
	if !hello {
		rc.r = bufio.NewReader(nc)
		return rc
	}
	b := localwire.Begin(nil, localwire.OpHello, 0, 0, 0)
	b, _ = localwire.Finish(localwire.AppendHello(b, localwire.Hello{Version: localwire.Version}))
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := rc.c.ReadMsgUnix(buf, oob)
	if err != nil || n < localwire.HeaderLen+20 || n != 4+int(binary.LittleEndian.Uint32(buf)) {
		t.Fatalf("hello reply: %d bytes, %v", n, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("hello carried %d control messages (%v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("hello carried fds %v (%v)", fds, err)
	}
	var stt unix.Stat_t
	if err := unix.Fstat(fds[0], &stt); err != nil || uint64(stt.Size) != f.st.Pool().Size() {
		t.Fatalf("memfd of %d bytes (%v), pool %d", stt.Size, err, f.st.Pool().Size())
	}
	unix.Close(fds[0])
	rep, err := localwire.DecodeHelloReply(buf[localwire.HeaderLen:n])
	if err != nil || rep.PoolSize != f.st.Pool().Size() || rep.LeaseTimeout != 60000 {
		t.Fatalf("hello reply %+v, %v", rep, err)
	}
	rc.hello = rep
	rc.r = bufio.NewReader(nc)
	return rc
}

// call sends a frame and returns the answer's header and results.
func (rc *rawConn) call(op localwire.Op, count int, body []byte) (localwire.Header, []localwire.Result) {
	rc.t.Helper()
	rc.seq++
	b := append(localwire.Begin(nil, op, 0, count, rc.seq), body...)
	b, _ = localwire.Finish(b)
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
	h, body := rc.read()
	if h.Status != localwire.StatusOK {
		return h, nil
	}
	res, err := localwire.DecodeResults(op, body, int(h.Count))
	if err != nil {
		rc.t.Fatal(err)
	}
	return h, res
}

func (rc *rawConn) read() (localwire.Header, []byte) {
	rc.t.Helper()
	hb := make([]byte, localwire.HeaderLen)
	if _, err := io.ReadFull(rc.r, hb); err != nil {
		rc.t.Fatalf("read answer: %v", err)
	}
	h, err := localwire.ParseHeader(hb)
	if err != nil {
		rc.t.Fatal(err)
	}
	body := make([]byte, h.BodyLen())
	if _, err := io.ReadFull(rc.r, body); err != nil {
		rc.t.Fatal(err)
	}
	return h, body
}

// expectClosed checks the daemon closed the connection.
func (rc *rawConn) expectClosed() {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rc.r.ReadByte(); !errors.Is(err, io.EOF) {
		rc.t.Fatalf("connection still open: %v", err)
	}
}

func allocBody(ns, hash string, k uint64) []byte {
	return localwire.AppendAllocItem(nil, localwire.AllocItem{
		Key: localwire.Key{Namespace: ns, Hash: []byte(hash)}, Slots: []localwire.SlotSize{{K: k}}})
}

func ids(v ...uint64) []byte {
	var b []byte
	for _, id := range v {
		b = localwire.AppendID(b, id)
	}
	return b
}

// TestLeaseIDsArePerConnection: a lease id means nothing on another
// connection, and a lease of one kind cannot be finished as the other.
func TestLeaseIDsArePerConnection(t *testing.T) {
	f := newFixture(t)
	a, b := f.dial(t, true), f.dial(t, true)
	_, res := a.call(localwire.OpAlloc, 1, allocBody("ns", "h", 100))
	if res[0].Status != localwire.StatusOK {
		t.Fatalf("alloc: %+v", res[0])
	}
	wid := res[0].Lease
	for _, op := range []localwire.Op{localwire.OpCommit, localwire.OpAbort, localwire.OpRelease, localwire.OpRenew} {
		if _, r := b.call(op, 1, ids(wid)); r[0].Status != localwire.StatusNoLease {
			t.Fatalf("%v of another connection's lease: %v, want no lease", op, r[0].Status)
		}
	}
	if _, r := a.call(localwire.OpRelease, 1, ids(wid)); r[0].Status != localwire.StatusNoLease {
		t.Fatalf("release of a write lease: %v", r[0].Status)
	}
	if _, r := a.call(localwire.OpCommit, 1, ids(wid)); r[0].Status != localwire.StatusOK || !r[0].Created {
		t.Fatalf("commit: %+v", r[0])
	}
	_, r := a.call(localwire.OpLease, 1, localwire.AppendKeyItem(nil, localwire.Key{Namespace: "ns", Hash: []byte("h")}))
	if r[0].Status != localwire.StatusOK || len(r[0].Slots) != 1 || r[0].Slots[0].K.Len != 100 {
		t.Fatalf("lease: %+v", r[0])
	}
	rid := r[0].Lease
	if _, r := a.call(localwire.OpCommit, 1, ids(rid)); r[0].Status != localwire.StatusNoLease {
		t.Fatalf("commit of a read lease: %v", r[0].Status)
	}
	if st := f.st.Stats(); st.Pinned != 1 {
		t.Fatalf("pinned %d, want 1", st.Pinned)
	}
	if _, r := a.call(localwire.OpRelease, 1, ids(rid)); r[0].Status != localwire.StatusOK {
		t.Fatalf("release: %v", r[0].Status)
	}
	if st := f.st.Stats(); st.Pinned != 0 || st.Blocks != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLeaseLimit(t *testing.T) {
	f := newFixture(t)
	c := f.dial(t, true)
	var body []byte
	for _, h := range []string{"a", "b", "c", "d", "e"} {
		body = append(body, allocBody("ns", h, 64)...)
	}
	_, res := c.call(localwire.OpAlloc, 5, body)
	for i, r := range res {
		want := localwire.StatusOK
		if i == 4 {
			want = localwire.StatusLimit
		}
		if r.Status != want {
			t.Fatalf("item %d: %v, want %v", i, r.Status, want)
		}
	}
	if used := f.st.Pool().Used(); used != 4*64 {
		t.Fatalf("pool used %d: the refused item kept its room", used)
	}
}

// TestMalformedClosesAndEndsLeases: a frame the daemon cannot parse is
// answered with a frame-level status, the connection closes, and what it
// held is given back.
func TestMalformedClosesAndEndsLeases(t *testing.T) {
	tests := []struct {
		name  string
		hello bool
		frame func() []byte
	}{
		{"no hello first", false, func() []byte {
			b, _ := localwire.Finish(append(localwire.Begin(nil, localwire.OpAlloc, 0, 1, 1), allocBody("ns", "x", 1)...))
			return b
		}},
		{"wrong version", false, func() []byte {
			b, _ := localwire.Finish(localwire.AppendHello(localwire.Begin(nil, localwire.OpHello, 0, 0, 1), localwire.Hello{Version: 99}))
			return b
		}},
		{"unknown op", true, func() []byte {
			b, _ := localwire.Finish(localwire.Begin(nil, 77, 0, 0, 1))
			return b
		}},
		{"count larger than the body", true, func() []byte {
			b, _ := localwire.Finish(append(localwire.Begin(nil, localwire.OpRelease, 0, 3, 1), ids(1)...))
			return b
		}},
		{"trailing bytes", true, func() []byte {
			b, _ := localwire.Finish(append(append(localwire.Begin(nil, localwire.OpAlloc, 0, 1, 1), allocBody("ns", "x", 1)...), 0))
			return b
		}},
		{"too many slots", true, func() []byte {
			b := localwire.Begin(nil, localwire.OpAlloc, 0, 1, 1)
			b = localwire.AppendAllocItem(b, localwire.AllocItem{Key: localwire.Key{Namespace: "n", Hash: []byte("h")},
				Slots: make([]localwire.SlotSize, localwire.MaxSlots+1)})
			b, _ = localwire.Finish(b)
			return b
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			c := f.dial(t, tc.hello)
			if tc.hello {
				if _, r := c.call(localwire.OpAlloc, 1, allocBody("ns", "held", 4096)); r[0].Status != localwire.StatusOK {
					t.Fatalf("alloc: %+v", r[0])
				}
			}
			if _, err := c.c.Write(tc.frame()); err != nil {
				t.Fatal(err)
			}
			h, msg := c.read()
			if h.Status != localwire.StatusInvalid || len(msg) == 0 {
				t.Fatalf("answer %+v %q, want a frame-level invalid with a message", h, msg)
			}
			c.expectClosed()
			deadline := time.Now().Add(5 * time.Second)
			for f.st.Pool().Used() != 0 || f.srv.Leases().Len() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("after the refusal: pool used %d, %d leases", f.st.Pool().Used(), f.srv.Leases().Len())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// TestOversizedLength: a length field over MaxFrame closes the connection
// before the daemon reads (or allocates) the body.
func TestOversizedLength(t *testing.T) {
	f := newFixture(t)
	c := f.dial(t, true)
	var hb [localwire.HeaderLen]byte
	binary.LittleEndian.PutUint32(hb[:], localwire.MaxFrame+1)
	hb[4] = byte(localwire.OpAlloc)
	if _, err := c.c.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	h, _ := c.read()
	if h.Status != localwire.StatusInvalid {
		t.Fatalf("answer %+v", h)
	}
	c.expectClosed()
}

func TestServerCloseEndsLeases(t *testing.T) {
	f := newFixture(t)
	c := f.dial(t, true)
	if _, r := c.call(localwire.OpAlloc, 1, allocBody("ns", "held", 4096)); r[0].Status != localwire.StatusOK {
		t.Fatalf("alloc: %+v", r[0])
	}
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if f.st.Pool().Used() != 0 || f.srv.Leases().Len() != 0 {
		t.Fatalf("after Close: pool used %d, %d leases", f.st.Pool().Used(), f.srv.Leases().Len())
	}
	c.expectClosed()
}

// TestLeaseMetrics: the live gauge follows the table, and leases ended by a
// disconnect or expiry are counted by reason (an unused reservation's
// expiry apart from a stuck client's).
func TestLeaseMetrics(t *testing.T) {
	f := newFixture(t)
	c := f.dial(t, true)
	_, res := c.call(localwire.OpAlloc, 2, append(allocBody("ns", "a", 64), allocBody("ns", "b", 64)...))
	if res[0].Status != localwire.StatusOK || res[1].Status != localwire.StatusOK {
		t.Fatalf("alloc: %+v", res)
	}
	if _, r := c.call(localwire.OpCommit, 1, ids(res[0].Lease)); r[0].Status != localwire.StatusOK {
		t.Fatalf("commit: %+v", r[0])
	}
	const live = `
# HELP pegaflow_local_leases Live leases of local clients on the data socket (write allocations and read pins).
# TYPE pegaflow_local_leases gauge
pegaflow_local_leases %d
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(fmt.Sprintf(live, 1)), "pegaflow_local_leases"); err != nil {
		t.Fatal(err)
	}
	c.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.Leases().Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(fmt.Sprintf(live, 0)+`
# HELP pegaflow_local_lease_ends_total Local leases ended without their client finishing them, by reason (disconnected, expired, shutdown, spare_expired).
# TYPE pegaflow_local_lease_ends_total counter
pegaflow_local_lease_ends_total{reason="disconnected"} 1
pegaflow_local_lease_ends_total{reason="expired"} 0
pegaflow_local_lease_ends_total{reason="shutdown"} 0
pegaflow_local_lease_ends_total{reason="spare_expired"} 0
`), "pegaflow_local_leases", "pegaflow_local_lease_ends_total"); err != nil {
		t.Fatal(err)
	}

	// Expiry: a write lease left unfinished counts as expired (a stuck
	// client), an unused reservation (an idle client's spare) apart.
	c = f.dial(t, true)
	_, res = c.call(localwire.OpAlloc, 1, allocBody("ns", "c", 64))
	if res[0].Status != localwire.StatusOK {
		t.Fatalf("alloc: %+v", res[0])
	}
	c.reserve(64)
	c.reserve(64)
	if n := f.srv.Leases().ExpireBefore(time.Now().Add(time.Hour)); n != 3 {
		t.Fatalf("expired %d leases, want 3", n)
	}
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP pegaflow_local_lease_ends_total Local leases ended without their client finishing them, by reason (disconnected, expired, shutdown, spare_expired).
# TYPE pegaflow_local_lease_ends_total counter
pegaflow_local_lease_ends_total{reason="disconnected"} 1
pegaflow_local_lease_ends_total{reason="expired"} 1
pegaflow_local_lease_ends_total{reason="shutdown"} 0
pegaflow_local_lease_ends_total{reason="spare_expired"} 2
`), "pegaflow_local_lease_ends_total"); err != nil {
		t.Fatal(err)
	}
}

// TestHelloTimeout: a connection that never says hello is closed; one that
// did may then stay idle past the hello timeout.
func TestHelloTimeout(t *testing.T) {
	f := newFixture(t)
	silent := f.dial(t, false)
	idle := f.dial(t, true)
	silent.expectClosed()
	time.Sleep(300 * time.Millisecond)
	if _, r := idle.call(localwire.OpAlloc, 1, allocBody("ns", "late", 64)); r[0].Status != localwire.StatusOK {
		t.Fatalf("alloc after idling: %+v", r[0])
	}
}

// flakyListener fails its first Accepts as a process out of descriptors
// does (EMFILE), then accepts normally.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &os.SyscallError{Syscall: "accept4", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsPass: a failed accept (EMFILE in a burst of clients) is
// retried, not the end of the data socket: before, Serve returned, the
// daemon counted a server down and the watchdog stopped pinging (review
// finding).
func TestAcceptErrorsPass(t *testing.T) {
	f := newFixtureWith(t, func(l net.Listener) net.Listener {
		fl := &flakyListener{Listener: l}
		fl.fails.Store(3)
		return fl
	})
	nc, err := net.Dial("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	b := localwire.Begin(nil, localwire.OpHello, 0, 0, 0)
	b, _ = localwire.Finish(localwire.AppendHello(b, localwire.Hello{Version: localwire.Version}))
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := nc.(*net.UnixConn).ReadMsgUnix(make([]byte, 64), oob)
	if err != nil || n == 0 {
		t.Fatalf("no hello answer after 3 failed accepts (data socket stopped accepting?): %d bytes, %v", n, err)
	}
	if fds, err := parseFDs(oob[:oobn]); err == nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

func parseFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) == 0 {
		return nil, fmt.Errorf("no control message: %v", err)
	}
	return unix.ParseUnixRights(&msgs[0])
}
