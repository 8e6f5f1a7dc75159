package localdata

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

func reserveBody(sizes ...uint64) []byte { return ids(sizes...) }

func putBody(id uint64, ns, hash string, k, next uint64) []byte {
	return localwire.AppendPutItem(nil, localwire.PutItem{ID: id,
		Key: localwire.Key{Namespace: ns, Hash: []byte(hash)}, Slots: []localwire.SlotSize{{K: k}}, Next: next})
}

// reserve takes one reservation of n bytes on c.
func (rc *rawConn) reserve(n uint64) localwire.Result {
	rc.t.Helper()
	_, r := rc.call(localwire.OpReserve, 1, reserveBody(n))
	if r[0].Status != localwire.StatusOK || r[0].Seg.Len != n || r[0].Lease == 0 {
		rc.t.Fatalf("reserve %d: %+v", n, r[0])
	}
	return r[0]
}

// TestReservePut: PUT turns a reservation into a block and reserves the
// next room in the same answer; what it refuses leaves the reservation as
// it was; a reservation is finished only by PUT or ABORT.
func TestReservePut(t *testing.T) {
	f := newFixture(t)
	c := f.dial(t, true)
	r := c.reserve(100)
	_, res := c.call(localwire.OpPut, 1, putBody(r.Lease, "ns", "a", 100, 100))
	p := res[0]
	if p.Status != localwire.StatusOK || !p.Created || p.Next != localwire.StatusOK || p.Lease == 0 || p.Seg.Len != 100 {
		t.Fatalf("put: %+v", p)
	}
	if st := f.st.Stats(); st.Blocks != 1 || st.Bytes != 100 {
		t.Fatalf("after put: %+v", st)
	}
	if _, r := c.call(localwire.OpPut, 1, putBody(r.Lease, "ns", "b", 100, 0)); r[0].Status != localwire.StatusNoLease {
		t.Fatalf("put of a finished reservation: %+v", r[0])
	}
	next := p.Lease
	live := f.srv.Leases().Len()
	refused := []struct {
		name string
		op   localwire.Op
		body []byte
		want localwire.Status
	}{
		{"wrong size", localwire.OpPut, putBody(next, "ns", "b", 99, 100), localwire.StatusInvalid},
		{"empty namespace", localwire.OpPut, putBody(next, "", "b", 100, 100), localwire.StatusInvalid},
		{"commit of a reservation", localwire.OpCommit, ids(next), localwire.StatusNoLease},
		{"release of a reservation", localwire.OpRelease, ids(next), localwire.StatusNoLease},
	}
	for _, tc := range refused {
		if _, r := c.call(tc.op, 1, tc.body); r[0].Status != tc.want {
			t.Fatalf("%s: %+v, want %v", tc.name, r[0], tc.want)
		}
		if n := f.srv.Leases().Len(); n != live {
			t.Fatalf("%s: %d leases after, %d before", tc.name, n, live)
		}
	}
	// The same key again: the copy is dropped, its room given back.
	_, res = c.call(localwire.OpPut, 1, putBody(next, "ns", "a", 100, 0))
	if res[0].Status != localwire.StatusOK || res[0].Created || res[0].Lease != 0 {
		t.Fatalf("put of a stored key: %+v", res[0])
	}
	if used := f.st.Pool().Used(); used != 128 { // the block, rounded to the pool's alignment
		t.Fatalf("pool used %d, want only the block's 128", used)
	}
	// PUT with an ALLOC lease: refused, the write lease stays.
	_, res = c.call(localwire.OpAlloc, 1, allocBody("ns", "c", 64))
	if _, r := c.call(localwire.OpPut, 1, putBody(res[0].Lease, "ns", "c", 64, 0)); r[0].Status != localwire.StatusNoLease {
		t.Fatalf("put of an alloc lease: %+v", r[0])
	}
	if _, r := c.call(localwire.OpCommit, 1, ids(res[0].Lease)); r[0].Status != localwire.StatusOK || !r[0].Created {
		t.Fatalf("commit after a refused put: %+v", r[0])
	}
	// A next reservation that cannot be had does not undo the block.
	r = c.reserve(64)
	_, res = c.call(localwire.OpPut, 1, putBody(r.Lease, "ns", "d", 64, 2<<20))
	if res[0].Status != localwire.StatusOK || !res[0].Created || res[0].Next != localwire.StatusPoolFull || res[0].Lease != 0 {
		t.Fatalf("put with a next too large: %+v", res[0])
	}
	for _, n := range []uint64{0, store.MaxBlockLen + 1} {
		if _, r := c.call(localwire.OpReserve, 1, reserveBody(n)); r[0].Status != localwire.StatusInvalid {
			t.Fatalf("reserve %d: %+v", n, r[0])
		}
	}
	// ABORT gives a reservation back; a disconnect ends the others.
	r = c.reserve(64)
	if _, res := c.call(localwire.OpAbort, 1, ids(r.Lease)); res[0].Status != localwire.StatusOK {
		t.Fatalf("abort of a reservation: %+v", res[0])
	}
	c.reserve(64)
	c.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.Leases().Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d leases left after the disconnect", f.srv.Leases().Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if used, want := f.st.Pool().Used(), uint64(128+64+64); used != want {
		t.Fatalf("pool used %d after the disconnect, want the three blocks' %d", used, want)
	}
}

// TestHelloVersions: a daemon speaks every version from MinVersion to
// Version and answers with the one asked for; others are refused.
func TestHelloVersions(t *testing.T) {
	f := newFixture(t)
	for _, v := range []uint32{localwire.MinVersion, localwire.Version, localwire.Version + 1, 0} {
		nc, err := net.Dial("unix", f.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := localwire.Finish(localwire.AppendHello(localwire.Begin(nil, localwire.OpHello, 0, 0, 1), localwire.Hello{Version: v}))
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
		buf, oob := make([]byte, 256), make([]byte, 64)
		n, oobn, _, _, err := nc.(*net.UnixConn).ReadMsgUnix(buf, oob)
		nc.Close()
		if err != nil || n < localwire.HeaderLen {
			t.Fatalf("version %d: %d bytes, %v", v, n, err)
		}
		if fds, err := parseFDs(oob[:oobn]); err == nil {
			for _, fd := range fds {
				_ = closeFD(fd)
			}
		}
		h, _ := localwire.ParseHeader(buf[:n])
		speaks := v >= localwire.MinVersion && v <= localwire.Version
		if !speaks {
			if h.Status != localwire.StatusInvalid {
				t.Fatalf("version %d accepted: %+v", v, h)
			}
			continue
		}
		rep, err := localwire.DecodeHelloReply(buf[localwire.HeaderLen:n])
		if h.Status != localwire.StatusOK || err != nil || rep.Version != v {
			t.Fatalf("version %d: answer %+v %+v %v", v, h, rep, err)
		}
	}
}

// TestFrameBeforeHelloAllocatesNothing: a peer that has not said hello
// and sends a header announcing a MaxFrame body is refused from the
// header alone; before, the daemon allocated the 16 MiB body first
// (review finding).
func TestFrameBeforeHelloAllocatesNothing(t *testing.T) {
	for _, op := range []localwire.Op{localwire.OpAlloc, localwire.OpHello} {
		t.Run(op.String(), func(t *testing.T) {
			f := newFixture(t)
			c := f.dial(t, false)
			var hb [localwire.HeaderLen]byte
			binary.LittleEndian.PutUint32(hb[:], localwire.MaxFrame)
			hb[4] = byte(op)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if _, err := c.c.Write(hb[:]); err != nil {
				t.Fatal(err)
			}
			_ = c.c.CloseWrite() // the old code waited for the body: give it EOF instead
			_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			answer, err := io.ReadAll(c.r) // to the daemon's close
			if err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > localwire.MaxFrame/4 {
				t.Fatalf("a header without hello cost %d bytes of allocation", got)
			}
			if len(answer) < localwire.HeaderLen {
				t.Fatalf("no refusal before the close: %q", answer)
			}
			if h, _ := localwire.ParseHeader(answer); h.Status != localwire.StatusInvalid || !bytes.Contains(answer, []byte("hello")) {
				t.Fatalf("answer %+v %q", h, answer[localwire.HeaderLen:])
			}
		})
	}
}

// TestLeaseAnswerAllocs: answering LEASE and RELEASE costs one allocation
// per block (its lease-table entry); before, the held value and the
// answer's slot places were allocated per block too (review finding).
func TestLeaseAnswerAllocs(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(p, nil)
	srv := New(Options{Store: st, LeaseTimeout: time.Minute, Log: zerolog.Nop()})
	t.Cleanup(func() { _ = srv.Close(); _ = p.Close() })
	const blocks = 64
	keys := make([]localwire.Key, blocks)
	for i := range keys {
		keys[i] = localwire.Key{Namespace: "ns", Hash: []byte{byte(i)}}
		ext, err := st.AllocExtent(64)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Insert(store.Key{Namespace: "ns", Hash: string(keys[i].Hash)}, ext,
			[]store.SlotLayout{{KLen: 32}, {KOff: 32, KLen: 16, VOff: 48, VLen: 16}}); err != nil {
			t.Fatal(err)
		}
		st.ReleaseExtent(ext)
	}
	cn := &conn{s: srv, owner: srv.leases.NewOwner()}
	t.Cleanup(func() { cn.owner.Close() })
	var b []byte
	leaseAll := func() {
		b = cn.lease(localwire.Begin(b, localwire.OpLease, 0, blocks, 1), keys)
		res, err := localwire.DecodeResults(localwire.OpLease, b[localwire.HeaderLen:], blocks)
		if err != nil {
			t.Fatal(err)
		}
		b = localwire.Begin(b, localwire.OpRelease, 0, blocks, 2)
		for _, r := range res {
			if r.Status != localwire.StatusOK {
				t.Fatalf("lease: %+v", r)
			}
			b = cn.finish(b, localwire.OpRelease, leaseID(r.Lease))
		}
	}
	leaseAll() // grow the buffers and the owner's map
	all := testing.AllocsPerRun(20, leaseAll)
	// What the test itself allocates decoding the answer, to take away.
	enc := append([]byte(nil), cn.lease(localwire.Begin(nil, localwire.OpLease, 0, blocks, 1), keys)...)
	decode := testing.AllocsPerRun(20, func() {
		if _, err := localwire.DecodeResults(localwire.OpLease, enc[localwire.HeaderLen:], blocks); err != nil {
			t.Fatal(err)
		}
	})
	perBlock := (all - decode) / blocks
	t.Logf("%.2f allocations per leased and released block (%.0f in all, %.0f of them decoding)", perBlock, all, decode)
	if perBlock > 1.5 {
		t.Fatalf("%.2f allocations per leased and released block, want about 1 (the lease entry)", perBlock)
	}
}

func leaseID(v uint64) lease.ID { return lease.ID(v) }

func closeFD(fd int) error { return unix.Close(fd) }

// TestPutInsertFailsAfterTake: a PUT whose insert fails once its
// reservation was taken answers a status that says the reservation is
// over (internal; status invalid promises it is still the client's), so
// the client drops its spare instead of copying its next block into room
// another block holds by then.
func TestPutInsertFailsAfterTake(t *testing.T) {
	var fail atomic.Bool
	var f *fixture
	f = newFixtureWith(t, func(l net.Listener) net.Listener { return l }, func(s *Server) {
		s.insert = func(k store.CheckedKey, e *store.Extent, lay []store.SlotLayout) (bool, error) {
			if fail.Swap(false) {
				return false, fmt.Errorf("%w: injected after the lease was taken", store.ErrInvalid)
			}
			return f.st.InsertChecked(k, e, lay)
		}
	})
	dial := func() *client.Client {
		c, err := client.Dial(context.Background(), "unused", client.WithDataSocket(f.path))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	const size = 4096
	a, b := dial(), dial()

	fail.Store(true)
	if err := a.Put(ctx, "ns", []byte("lost"), bytes.Repeat([]byte{1}, size)); !errors.Is(err, client.ErrInternal) {
		t.Fatalf("Put whose insert failed: %v, want ErrInternal", err)
	}
	if live := f.srv.Leases().Len(); live != 0 {
		t.Fatalf("%d leases live after the failed Put, want 0 (the reservation ended)", live)
	}
	// Another client takes the room the failed Put's reservation freed.
	x := bytes.Repeat([]byte{2}, size)
	if err := b.Put(ctx, "ns", []byte("x"), x); err != nil {
		t.Fatal(err)
	}
	y := bytes.Repeat([]byte{3}, size)
	if err := a.Put(ctx, "ns", []byte("y"), y); err != nil {
		t.Fatalf("Put after a failed one: %v (a kept a spare the daemon had ended)", err)
	}
	dst := make([]byte, size)
	for _, blk := range []struct {
		hash string
		want []byte
	}{{"x", x}, {"y", y}} {
		if _, err := b.Get(ctx, "ns", []byte(blk.hash), dst); err != nil || !bytes.Equal(dst, blk.want) {
			t.Fatalf("block %s: %v, intact %v", blk.hash, err, bytes.Equal(dst, blk.want))
		}
	}
}
