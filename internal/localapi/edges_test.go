package localapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

const mib = 1 << 20

// putN stores an n-byte block of pattern seed under ns/hash.
func putN(t *testing.T, e *env, hash []byte, n int, seed byte) {
	t.Helper()
	msgs := append([]*pegadv1.PutBlockRequest{hdr("ns", hash, uint64(n), 0)}, chunks(pattern(n, seed), MaxChunk)...)
	if _, err := put(t, e.local, msgs...); err != nil {
		t.Fatal(err)
	}
}

// TestStalledPutEvictsNothing (issue 15 item 2): a PutBlock that stalls
// after its header (or after a first chunk) evicts nothing and holds no
// pool space; it is cut off after the idle timeout, and its buffered
// bytes come back.
func TestStalledPutEvictsNothing(t *testing.T) {
	tests := []struct {
		name string
		sent []*pegadv1.PutBlockRequest
	}{
		{"header only", nil},
		{"one chunk then nothing", []*pegadv1.PutBlockRequest{data(bytes.Repeat([]byte{3}, MaxChunk))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const idle = time.Second
			// As the issue found it, scaled down: a header for 15 MiB in a
			// 16 MiB pool holding four 2 MiB blocks.
			e := newEnvWith(t, 16*mib, false, func(o *LocalOptions) { o.PutIdleTimeout = idle })
			for i := range 4 {
				if _, err := e.store.Put(store.Key{Namespace: "ns", Hash: string(rune('1' + i))}, []store.SlotSize{{KSize: 2 * mib}},
					func([]byte) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			before := e.store.Stats()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := e.local.PutBlock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range append([]*pegadv1.PutBlockRequest{hdr("ns", []byte("big"), 15*mib, 0)}, tc.sent...) {
				if err := s.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(idle / 3) // the header (and chunk) have long arrived
			mid := e.store.Stats()
			if mid.Blocks != 4 || mid.Evictions != before.Evictions || mid.Pool.Used != before.Pool.Used {
				t.Fatalf("a stalled 15 MiB put changed the store: blocks %d (want 4), evictions %d (want %d), pool used %d (want %d)",
					mid.Blocks, mid.Evictions, before.Evictions, mid.Pool.Used, before.Pool.Used)
			}
			start := time.Now()
			err = s.RecvMsg(new(pegadv1.PutBlockResponse))
			if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second {
				t.Fatalf("stalled put ended with %v after %v, want DeadlineExceeded after the %v idle timeout", err, time.Since(start), idle)
			}
			after := e.store.Stats()
			if after.Blocks != 4 || after.Evictions != before.Evictions || after.Pool.Used != before.Pool.Used {
				t.Fatalf("store changed by a put that timed out: %+v", after)
			}
			e.localSrv.putBuf.mu.Lock()
			free := e.localSrv.putBuf.free
			e.localSrv.putBuf.mu.Unlock()
			if free != e.localSrv.putBuf.size {
				t.Fatalf("put buffer %d of %d free after the stream ended", free, e.localSrv.putBuf.size)
			}
			// A put that does send its bytes still makes room (evicting).
			body := bytes.Repeat([]byte{7}, 15*mib)
			if _, err := put(t, e.local, append([]*pegadv1.PutBlockRequest{hdr("ns", []byte("big"), 15*mib, 0)}, chunks(body, MaxChunk)...)...); err != nil {
				t.Fatalf("complete put after the stalled one: %v", err)
			}
			if st := e.store.Stats(); st.Evictions == before.Evictions || !e.store.Has(store.Key{Namespace: "ns", Hash: "big"}) {
				t.Fatalf("complete put: %+v, want it stored, evicting", st)
			}
		})
	}
}

// TestPutBufferBounded: puts whose bytes in flight pass the put buffer
// fail at once with ResourceExhausted instead of waiting (no deadlock),
// and nothing is stored.
func TestPutBufferBounded(t *testing.T) {
	e := newEnvWith(t, 64*mib, false, func(o *LocalOptions) { o.PutBufferBytes = 4 * mib })
	_, err := put(t, e.local, append([]*pegadv1.PutBlockRequest{hdr("ns", []byte("x"), 5*mib, 0)}, chunks(pattern(5*mib, 1), MaxChunk)...)...)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("block larger than the put buffer: %v, want ResourceExhausted", err)
	}
	// One stream holds 3 MiB; a second one then cannot take 2 MiB more.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.local.PutBlock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range append([]*pegadv1.PutBlockRequest{hdr("ns", []byte("a"), 4*mib, 0)}, chunks(pattern(3*mib, 2), MaxChunk)...) {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, func() bool {
		e.localSrv.putBuf.mu.Lock()
		defer e.localSrv.putBuf.mu.Unlock()
		return e.localSrv.putBuf.free == mib
	})
	_, err = put(t, e.local, append([]*pegadv1.PutBlockRequest{hdr("ns", []byte("b"), 2*mib, 0)}, chunks(pattern(2*mib, 3), MaxChunk)...)...)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("put past the buffer: %v, want ResourceExhausted", err)
	}
	if err := s.Send(data(pattern(mib, 4))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseAndRecv(); err != nil {
		t.Fatalf("first put: %v", err)
	}
	if st := e.store.Stats(); st.Blocks != 1 {
		t.Fatalf("%d blocks, want 1", st.Blocks)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeGetStream is a GetBlock server stream that records what is sent;
// onHeader and onData run as the header and each data message go out.
type fakeGetStream struct {
	grpc.ServerStream
	ctx      context.Context
	onHeader func()
	onData   func() error
	hdr      *pegadv1.BlockInfo
	data     bytes.Buffer
}

func (f *fakeGetStream) Context() context.Context { return f.ctx }
func (f *fakeGetStream) Send(m *pegadv1.GetBlockResponse) error {
	if h := m.GetHeader(); h != nil {
		f.hdr = h
		if f.onHeader != nil {
			f.onHeader()
		}
		return nil
	}
	if f.onData != nil {
		if err := f.onData(); err != nil {
			return err
		}
	}
	f.data.Write(m.GetData())
	return nil
}

// TestGetBlockReadsThePinnedBlock (item 5): the block deleted and put
// again under the same key between GetBlock's header and its data does
// not lend its bytes: header and data both come from the pinned block.
func TestGetBlockReadsThePinnedBlock(t *testing.T) {
	e := newEnv(t, 16*mib, false)
	hash := []byte("k")
	putN(t, e, hash, 2*mib, 1)
	key := store.Key{Namespace: "ns", Hash: string(hash)}
	fs := &fakeGetStream{ctx: context.Background(), onHeader: func() {
		if _, err := e.store.Delete(key); err != nil {
			t.Error(err)
		}
		if _, err := e.store.Put(key, []store.SlotSize{{KSize: 2 * mib}}, func(b []byte) error {
			copy(b, pattern(2*mib, 99))
			return nil
		}); err != nil {
			t.Error(err)
		}
	}}
	if err := e.localSrv.GetBlock(&pegadv1.GetBlockRequest{Namespace: "ns", Hash: hash}, fs); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fs.data.Bytes(), pattern(2*mib, 1)) {
		t.Fatal("GetBlock sent the header of the block it pinned with the bytes of the block put after it")
	}
	if _, got, err := get(t, e.local, "ns", hash); err != nil || !bytes.Equal(got, pattern(2*mib, 99)) {
		t.Fatalf("the new block: %v", err)
	}
	if st := e.store.Stats(); st.DeferredFree != 0 || st.Pinned != 0 {
		t.Fatalf("pins left: %+v", st)
	}
}

// TestWaitOutlastsHandlers (item 6): Wait returns only after every
// handler that touches pool memory has returned (the daemon unmaps the
// pool right after it), and later calls are refused.
func TestWaitOutlastsHandlers(t *testing.T) {
	e := newEnv(t, 16*mib, false)
	putN(t, e, []byte("k"), 4*mib, 1)
	inSend := make(chan struct{})
	unblock := make(chan struct{})
	var once sync.Once
	fs := &fakeGetStream{ctx: context.Background(), onData: func() error {
		once.Do(func() { close(inSend) })
		<-unblock
		return errors.New("client went away")
	}}
	handler := make(chan error, 1)
	go func() {
		handler <- e.localSrv.GetBlock(&pegadv1.GetBlockRequest{Namespace: "ns", Hash: []byte("k")}, fs)
	}()
	<-inSend // the handler is copying out of pool memory
	waited := make(chan struct{})
	go func() {
		e.localSrv.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("Wait returned while a GetBlock was still reading pool memory")
	case <-time.After(100 * time.Millisecond):
	}
	close(unblock)
	if err := <-handler; err == nil {
		t.Fatal("GetBlock succeeded after its stream failed")
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after the handler did")
	}
	if _, _, err := get(t, e.local, "ns", []byte("k")); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetBlock after Wait: %v, want Unavailable", err)
	}
	if _, err := put(t, e.local, hdr("ns", []byte("n"), 4, 0), data([]byte("abcd"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("PutBlock after Wait: %v, want Unavailable", err)
	}
}

// TestListBlocksPaged (item 4): ListBlocks answers a page at a time
// (limit + cursor), newest first, each block once; a page stays under the
// slot bound whatever the limit asked; a bad cursor is InvalidArgument.
func TestListBlocksPaged(t *testing.T) {
	e := newEnv(t, 16*mib, false)
	ext, err := e.store.AllocExtent(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer e.store.ReleaseExtent(ext)
	wide := make([]store.SlotLayout, store.MaxSlots) // 1024 slots
	for i := range wide {
		wide[i] = store.SlotLayout{KLen: 8}
	}
	for i := range 40 {
		if _, err := e.store.Insert(store.Key{Namespace: "wide", Hash: fmt.Sprint(i)}, ext, wide); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.Insert(store.Key{Namespace: "narrow", Hash: fmt.Sprintf("%03d", i)}, ext, wide[:1]); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	// 40 blocks of 1024 slots: a page stops before MaxListSlots.
	r, err := e.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Namespace: "wide", Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.GetBlocks()); n != MaxListSlots/store.MaxSlots || r.GetNextCursor() == "" || !r.GetTruncated() {
		t.Fatalf("wide page: %d blocks, next %q; want %d and a next page", n, r.GetNextCursor(), MaxListSlots/store.MaxSlots)
	}
	// Follow the cursor through one namespace, 7 at a time.
	var got []string
	req := &pegadv1.ListBlocksRequest{Namespace: "narrow", Limit: 7}
	for pages := 1; ; pages++ {
		r, err := e.local.ListBlocks(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range r.GetBlocks() {
			got = append(got, string(b.GetHash()))
		}
		if r.GetNextCursor() == "" {
			break
		}
		if pages > 10 {
			t.Fatal("cursor does not advance")
		}
		req.Cursor = r.GetNextCursor()
	}
	if len(got) != 40 || got[0] != "039" || got[39] != "000" {
		t.Fatalf("paged listing: %d blocks %v, want 40 newest first", len(got), got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] >= got[i-1] {
			t.Fatalf("not newest first: %v", got)
		}
	}
	for _, c := range []string{"x", "0", "-1"} {
		if _, err := e.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Cursor: c}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("cursor %q: %v, want InvalidArgument", c, err)
		}
	}
}

// TestListSessionsPaged (item 4): ListSessions pages the holder's
// sessions (default and capped page size) and lists fetches on the first
// page only.
func TestListSessionsPaged(t *testing.T) {
	e := newEnv(t, 4*mib, true)
	for i := range 2*DefaultListLimit + 5 {
		e.locks.sessions = append(e.locks.sessions, holder.SessionInfo{ID: fmt.Sprint(i), CreatedAt: e.now})
	}
	e.fetcher.inflight = []requester.FetchInfo{{ReqID: "r1", Started: e.now}}
	ctx := context.Background()
	req := &pegadv1.ListSessionsRequest{}
	var sizes []int
	for {
		r, err := e.admin.ListSessions(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(r.GetSessions()))
		if want := len(sizes) == 1; (len(r.GetFetches()) == 1) != want {
			t.Fatalf("page %d: %d fetches, want them on the first page only", len(sizes), len(r.GetFetches()))
		}
		if r.GetNextCursor() == "" {
			break
		}
		req.Cursor = r.GetNextCursor()
	}
	if fmt.Sprint(sizes) != fmt.Sprint([]int{DefaultListLimit, DefaultListLimit, 5}) {
		t.Fatalf("page sizes %v", sizes)
	}
	r, err := e.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{Limit: 100000})
	if err != nil || len(r.GetSessions()) != len(e.locks.sessions) {
		t.Fatalf("large limit: %d sessions, %v", len(r.GetSessions()), err)
	}
	if _, err := e.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{Cursor: "nope"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad cursor: %v", err)
	}
}
