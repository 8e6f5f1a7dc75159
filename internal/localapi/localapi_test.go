package localapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakes of the components the APIs read.

type fakeFetcher struct {
	res      *requester.Result
	err      error
	inflight []requester.FetchInfo
	gotPeer  string
	gotNS    string
	gotN     int
	deadline bool
}

func (f *fakeFetcher) Fetch(ctx context.Context, r requester.Request) (*requester.Result, error) {
	f.gotPeer, f.gotNS, f.gotN = r.Peer, r.Namespace, len(r.Hashes)
	_, f.deadline = ctx.Deadline()
	return f.res, f.err
}
func (f *fakeFetcher) InFlight() []requester.FetchInfo { return f.inflight }

type fakeLocks struct {
	sessions []holder.SessionInfo
	released map[string]string // id → operator
	err      error
}

// SessionsPage pages l.sessions; a session's cursor is its index + 1.
func (l *fakeLocks) SessionsPage(cursor uint64, limit int) ([]holder.SessionInfo, uint64) {
	rest := l.sessions[min(int(cursor), len(l.sessions)):]
	if len(rest) > limit {
		return rest[:limit], cursor + uint64(limit)
	}
	return rest, 0
}
func (l *fakeLocks) ForceRelease(id, op string) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	l.released[id] = op
	return 3, nil
}
func (l *fakeLocks) Len() int          { return len(l.sessions) }
func (l *fakeLocks) LockedBlocks() int { return 7 }

type fakeConns struct{ list []conn.ConnInfo }

func (c *fakeConns) List() []conn.ConnInfo { return c.list }
func (c *fakeConns) QPs() int              { return 4 }

type env struct {
	store   *store.Store
	fetcher *fakeFetcher
	locks   *fakeLocks
	conns   *fakeConns
	metrics *metrics.Metrics
	local   pegadv1.LocalServiceClient
	// localSrv is the server behind local.
	localSrv *Local
	admin    pegadv1.AdminServiceClient
	now      time.Time
}

// newEnv serves Local and Admin over bufconn on a real pool and store of
// poolSize bytes; fetcher nil → no prefetch engine.
func newEnv(t *testing.T, poolSize uint64, withFetcher bool) *env {
	t.Helper()
	return newEnvWith(t, poolSize, withFetcher, nil)
}

// newEnvWith is newEnv with mod applied to the LocalOptions.
func newEnvWith(t *testing.T, poolSize uint64, withFetcher bool, mod func(*LocalOptions)) *env {
	t.Helper()
	p, err := pool.New(pool.Options{Size: poolSize, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{
		metrics: metricstest.New(),
		locks:   &fakeLocks{released: map[string]string{}},
		conns:   &fakeConns{},
		now:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	e.store = store.New(p, e.metrics)
	var f Fetcher
	if withFetcher {
		e.fetcher = &fakeFetcher{}
		f = e.fetcher
	}
	now := func() time.Time { return e.now }
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(MaxRecvMsgSize))
	lo := LocalOptions{Store: e.store, Fetcher: f, Log: zerolog.Nop(), Now: now}
	if mod != nil {
		mod(&lo)
	}
	e.localSrv = NewLocal(lo)
	pegadv1.RegisterLocalServiceServer(srv, e.localSrv)
	pegadv1.RegisterAdminServiceServer(srv, NewAdmin(AdminOptions{
		Store: e.store, Locks: e.locks, Conns: e.conns, Fetcher: f, Metrics: e.metrics,
		Node: NodeInfo{NodeID: "n1", Incarnation: "inc1", Transport: "tcp", Started: e.now.Add(-time.Minute)},
		Log:  zerolog.Nop(), Now: now,
	}))
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(4<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		_ = p.Close()
	})
	e.local = pegadv1.NewLocalServiceClient(cc)
	e.admin = pegadv1.NewAdminServiceClient(cc)
	return e
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>11)
	}
	return b
}

// put sends msgs on a PutBlock stream and returns the outcome.
func put(t *testing.T, c pegadv1.LocalServiceClient, msgs ...*pegadv1.PutBlockRequest) (*pegadv1.PutBlockResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.PutBlock(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			break // the server answered early; CloseAndRecv has its status
		}
	}
	return s.CloseAndRecv()
}

func hdr(ns string, hash []byte, slots ...uint64) *pegadv1.PutBlockRequest {
	h := &pegadv1.PutBlockHeader{Namespace: ns, Hash: hash}
	for i := 0; i+1 < len(slots); i += 2 {
		h.Slots = append(h.Slots, &pegadv1.SlotSize{KSize: slots[i], VSize: slots[i+1]})
	}
	return &pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: h}}
}

func data(b []byte) *pegadv1.PutBlockRequest {
	return &pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: b}}
}

// chunks splits b into data messages of at most n bytes.
func chunks(b []byte, n int) []*pegadv1.PutBlockRequest {
	var out []*pegadv1.PutBlockRequest
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, data(b[:k]))
		b = b[k:]
	}
	return out
}

// get reads a block back: header and concatenated data.
func get(t *testing.T, c pegadv1.LocalServiceClient, ns string, hash []byte) (*pegadv1.BlockInfo, []byte, error) {
	t.Helper()
	s, err := c.GetBlock(context.Background(), &pegadv1.GetBlockRequest{Namespace: ns, Hash: hash})
	if err != nil {
		return nil, nil, err
	}
	var info *pegadv1.BlockInfo
	var buf bytes.Buffer
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return info, buf.Bytes(), nil
		}
		if err != nil {
			return nil, nil, err
		}
		if h := m.GetHeader(); h != nil {
			if info != nil || buf.Len() > 0 {
				t.Fatal("header not first or twice")
			}
			info = h
			continue
		}
		if len(m.GetData()) > MaxChunk {
			t.Fatalf("data message of %d bytes exceeds %d", len(m.GetData()), MaxChunk)
		}
		buf.Write(m.GetData())
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	e := newEnv(t, 32<<20, false)
	// Three slots, K and V, ~5.5 MiB in all: several 1 MiB messages.
	sizes := []uint64{1 << 20, 1<<20 + 3, 2 << 20, 0, 777, 1<<20 + 5}
	var total uint64
	for _, s := range sizes {
		total += s
	}
	body := pattern(int(total), 9)
	hash := []byte{0xde, 0xad, 0xbe, 0xef}
	msgs := append([]*pegadv1.PutBlockRequest{hdr("ns", hash, sizes...)}, chunks(body, 700<<10)...)
	resp, err := put(t, e.local, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBytes() != total || !resp.GetCreated() {
		t.Fatalf("put response %v, want bytes=%d created", resp, total)
	}
	info, got, err := get(t, e.local, "ns", hash)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("read back %d bytes, differ from the %d put", len(got), len(body))
	}
	if info.GetBytes() != total || len(info.GetSlots()) != 3 || info.GetSlots()[1].GetVSize() != 0 ||
		info.GetSlots()[2].GetKSize() != 777 || info.GetPins() != 0 || !bytes.Equal(info.GetHash(), hash) {
		t.Fatalf("header %v", info)
	}

	// A second put of the same key keeps the first copy.
	resp, err = put(t, e.local, hdr("ns", hash, 4, 0), data([]byte("abcd")))
	if err != nil || resp.GetCreated() {
		t.Fatalf("duplicate put: %v, %v; want created=false", resp, err)
	}
	if _, got, _ = get(t, e.local, "ns", hash); !bytes.Equal(got, body) {
		t.Fatal("duplicate put changed the stored block")
	}

	list, err := e.local.ListBlocks(context.Background(), &pegadv1.ListBlocksRequest{})
	if err != nil || len(list.GetBlocks()) != 1 || list.GetBlocks()[0].GetBytes() != total || list.GetTruncated() {
		t.Fatalf("list: %v, %v", list, err)
	}
	if _, err := e.local.DeleteBlock(context.Background(), &pegadv1.DeleteBlockRequest{Namespace: "ns", Hash: hash}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, e.local, "ns", hash); status.Code(err) != codes.NotFound {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	if _, err := e.local.DeleteBlock(context.Background(), &pegadv1.DeleteBlockRequest{Namespace: "ns", Hash: hash}); status.Code(err) != codes.NotFound {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
	if used := e.store.Stats().Pool.Used; used != 0 {
		t.Fatalf("pool used %d after delete, want 0", used)
	}
}

func TestPutRejected(t *testing.T) {
	const poolSize = 4 << 20
	h := []byte{1, 2, 3}
	big := make([]byte, MaxChunk+1)
	tests := []struct {
		name string
		msgs []*pegadv1.PutBlockRequest
		code codes.Code
	}{
		{"empty stream", nil, codes.InvalidArgument},
		{"data first", []*pegadv1.PutBlockRequest{data([]byte("x"))}, codes.InvalidArgument},
		{"empty namespace", []*pegadv1.PutBlockRequest{hdr("", h, 1, 0), data([]byte("x"))}, codes.InvalidArgument},
		{"empty hash", []*pegadv1.PutBlockRequest{hdr("ns", nil, 1, 0), data([]byte("x"))}, codes.InvalidArgument},
		{"hash too long", []*pegadv1.PutBlockRequest{hdr("ns", make([]byte, limits.MaxHashLen+1), 1, 0)}, codes.InvalidArgument},
		{"no slots", []*pegadv1.PutBlockRequest{hdr("ns", h)}, codes.InvalidArgument},
		{"empty K", []*pegadv1.PutBlockRequest{hdr("ns", h, 0, 4), data([]byte("abcd"))}, codes.InvalidArgument},
		{"short data", []*pegadv1.PutBlockRequest{hdr("ns", h, 8, 0), data([]byte("abcd"))}, codes.InvalidArgument},
		{"no data", []*pegadv1.PutBlockRequest{hdr("ns", h, 8, 0)}, codes.InvalidArgument},
		{"too much data", []*pegadv1.PutBlockRequest{hdr("ns", h, 4, 0), data([]byte("abcd")), data([]byte("e"))}, codes.InvalidArgument},
		{"second header", []*pegadv1.PutBlockRequest{hdr("ns", h, 4, 0), hdr("ns", h, 4, 0)}, codes.InvalidArgument},
		{"oversized chunk", []*pegadv1.PutBlockRequest{hdr("ns", h, uint64(len(big)), 0), data(big)}, codes.InvalidArgument},
		{"larger than pool", []*pegadv1.PutBlockRequest{hdr("ns", h, poolSize, 1), data([]byte("x"))}, codes.ResourceExhausted},
		{"overflowing size", []*pegadv1.PutBlockRequest{hdr("ns", h, store.MaxBlockLen, store.MaxBlockLen)}, codes.InvalidArgument},
	}
	e := newEnv(t, poolSize, false)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := put(t, e.local, tc.msgs...)
			if code, reason := pegaderr.FromStatus(err); code != tc.code || reason != reasonOf[tc.code] {
				t.Fatalf("got %v (reason %q), want %s with reason %q", err, reason, tc.code, reasonOf[tc.code])
			}
			st := e.store.Stats()
			if st.Blocks != 0 || st.Pool.Used != 0 {
				t.Fatalf("a rejected put left state: %d blocks, %d bytes used", st.Blocks, st.Pool.Used)
			}
		})
	}
}

// TestPutNoSpace: a block that fits the pool but not beside pinned blocks
// is refused with ResourceExhausted and nothing is stored or evicted.
func TestPutNoSpace(t *testing.T) {
	e := newEnv(t, 4<<20, false)
	var keys []store.Key
	for i := range 3 {
		hash := []byte{byte(i + 1)}
		if _, err := put(t, e.local, append([]*pegadv1.PutBlockRequest{hdr("ns", hash, 1<<20, 0)}, chunks(pattern(1<<20, byte(i)), MaxChunk)...)...); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, store.Key{Namespace: "ns", Hash: string(hash)})
	}
	pinned, missing := e.store.Pin(keys)
	if len(missing) != 0 {
		t.Fatalf("missing %v", missing)
	}
	defer e.store.Unpin(pinned)
	before := e.store.Stats()
	_, err := put(t, e.local, append([]*pegadv1.PutBlockRequest{hdr("ns", []byte{9}, 2<<20, 0)}, chunks(pattern(2<<20, 1), MaxChunk)...)...)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("put into a full pool: %v, want ResourceExhausted", err)
	}
	after := e.store.Stats()
	if after.Blocks != before.Blocks || after.Pool.Used != before.Pool.Used || after.Evictions != before.Evictions {
		t.Fatalf("state changed: before %+v after %+v", before, after)
	}
	// GetBlock of a pinned block reports the other pins, not its own.
	info, _, err := get(t, e.local, "ns", []byte{1})
	if err != nil || info.GetPins() != 1 {
		t.Fatalf("get pinned block: pins=%d err=%v, want 1", info.GetPins(), err)
	}
}

// reasonOf is the pegaderr reason each refusal in TestPutRejected and
// TestBadRequests must carry (issue 23: they had a code only).
var reasonOf = map[codes.Code]pegaderr.Reason{
	codes.InvalidArgument:   pegaderr.Invalid,
	codes.NotFound:          pegaderr.NotFound,
	codes.ResourceExhausted: pegaderr.NoSpace,
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, 2<<20, true)
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"get empty ns", func() error { _, _, err := get(t, e.local, "", []byte{1}); return err }, codes.InvalidArgument},
		{"get missing", func() error { _, _, err := get(t, e.local, "ns", []byte{1}); return err }, codes.NotFound},
		{"delete bad hash", func() error {
			_, err := e.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: "ns"})
			return err
		}, codes.InvalidArgument},
		{"list long ns", func() error {
			_, err := e.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Namespace: string(make([]byte, limits.MaxNamespaceLen+1))})
			return err
		}, codes.InvalidArgument},
		{"prefetch no hashes, no namespace", func() error {
			_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1"})
			return err
		}, codes.InvalidArgument},
		{"prefetch too many hashes", func() error {
			_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: make([][]byte, MaxPrefetchHashes+1)})
			return err
		}, codes.InvalidArgument},
		{"prefetch empty hash", func() error {
			_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{{1}, {}}})
			return err
		}, codes.InvalidArgument},
		{"prefetch negative timeout", func() error {
			_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{{1}},
				Timeout: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument},
		{"release empty id", func() error {
			_, err := e.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{})
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code, reason := pegaderr.FromStatus(err); code != tc.code || reason != reasonOf[tc.code] {
				t.Fatalf("got %v (reason %q), want %s with reason %q", err, reason, tc.code, reasonOf[tc.code])
			}
		})
	}
	if e.fetcher.gotN != 0 {
		t.Fatal("an invalid prefetch reached the engine")
	}
}

func TestPrefetch(t *testing.T) {
	ctx := context.Background()
	t.Run("no engine", func(t *testing.T) {
		e := newEnv(t, 2<<20, false)
		_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{{1}}})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("got %v, want Unavailable", err)
		}
	})
	e := newEnv(t, 2<<20, true)
	e.fetcher.res = &requester.Result{
		Bytes: 10, Duration: time.Millisecond, SessionID: "s1",
		Blocks: []requester.BlockResult{
			{Hash: []byte{1}, Status: requester.StatusFetched},
			{Hash: []byte{2}, Status: requester.StatusAlreadyLocal},
			{Hash: []byte{3}, Status: requester.StatusMissingOnPeer},
			{Hash: []byte{4}, Status: requester.StatusFailed, Err: errors.New("boom")},
			{Hash: []byte{5}, Status: requester.StatusDiscarded},
		},
	}
	resp, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns",
		Hashes: [][]byte{{1}, {2}, {3}, {4}, {5}}, Timeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	want := []pegadv1.PrefetchBlockStatus{
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED,
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL,
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER,
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED,
		pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED,
	}
	for i, b := range resp.GetBlocks() {
		if b.GetStatus() != want[i] {
			t.Errorf("block %d: %s, want %s", i, b.GetStatus(), want[i])
		}
	}
	if resp.GetBlocks()[3].GetError() != "boom" || resp.GetSessionId() != "s1" || resp.GetBytes() != 10 {
		t.Fatalf("response %v", resp)
	}
	if e.fetcher.gotPeer != "h:1" || e.fetcher.gotNS != "ns" || e.fetcher.gotN != 5 || !e.fetcher.deadline {
		t.Fatalf("engine called with %+v", e.fetcher)
	}

	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("fetch: %w", conn.ErrConnectionBroken), codes.Unavailable},
		{fmt.Errorf("stage: %w", store.ErrNoSpace), codes.ResourceExhausted},
		{fmt.Errorf("alloc: %w", pool.ErrNoSpace), codes.ResourceExhausted},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{conn.ErrRemoteMemory, codes.FailedPrecondition},
		{errors.New("other"), codes.Internal},
		// A fetch error's class decides, not the context error under it.
		{&requester.FetchError{Phase: "read", Class: requester.ErrDeadline, Err: context.Canceled}, codes.DeadlineExceeded},
		{&requester.FetchError{Phase: "stage", Class: requester.ErrLocalResource, Err: store.ErrNoSpace}, codes.ResourceExhausted},
		{&requester.FetchError{Phase: "read", Class: requester.ErrConnection, Err: conn.ErrConnectionBroken}, codes.Unavailable},
		{&requester.FetchError{Phase: "lock", Class: requester.ErrRemote, Err: errors.New("refused")}, codes.FailedPrecondition},
		{fmt.Errorf("release: %w", requester.ErrDiscarded), codes.Aborted},
	} {
		e.fetcher.res, e.fetcher.err = nil, tc.err
		_, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{{1}}})
		if status.Code(err) != tc.code {
			t.Errorf("engine error %v → %v, want %s", tc.err, err, tc.code)
		}
	}

	// A failed fetch's per-block results ride along as a status detail.
	e.fetcher.res = &requester.Result{Blocks: []requester.BlockResult{
		{Hash: []byte{7}, Status: requester.StatusDiscarded, Err: requester.ErrDiscarded}}}
	e.fetcher.err = fmt.Errorf("release: %w", requester.ErrDiscarded)
	_, err = e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{{7}}})
	var detail *pegadv1.PrefetchResponse
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*pegadv1.PrefetchResponse); ok {
			detail = r
		}
	}
	if status.Code(err) != codes.Aborted || detail == nil || len(detail.GetBlocks()) != 1 ||
		detail.GetBlocks()[0].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED {
		t.Fatalf("failed prefetch: %v, detail %v", err, detail)
	}
}

func TestAdmin(t *testing.T) {
	e := newEnv(t, 2<<20, true)
	ctx := context.Background()
	e.locks.sessions = []holder.SessionInfo{{
		ID: "0123456789abcdef0123456789abcdef", RequesterID: "r1", Incarnation: "i1", Blocks: 2, Bytes: 64,
		CreatedAt: e.now.Add(-30 * time.Second), ExpiresAt: e.now.Add(90 * time.Second), Renewals: 1,
	}, {
		ID: "ffffffffffffffffffffffffffffffff", RequesterID: "r2", CreatedAt: e.now.Add(-200 * time.Second),
		ExpiresAt: e.now.Add(-time.Second),
	}}
	e.fetcher.inflight = []requester.FetchInfo{{ReqID: "q1", Peer: "p:1", SessionID: "s", Blocks: 3, Bytes: 9,
		Started: e.now.Add(-2 * time.Second), Phase: "read"}}
	ls, err := e.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s := ls.GetSessions()
	if len(s) != 2 || s[0].GetAge().AsDuration() != 30*time.Second || s[0].GetExpiresIn().AsDuration() != 90*time.Second ||
		s[0].GetBlocks() != 2 || s[0].GetRenewals() != 1 || s[0].GetRequesterIncarnation() != "i1" {
		t.Fatalf("sessions %v", s)
	}
	if s[1].GetExpiresIn().AsDuration() != 0 {
		t.Fatalf("an overdue session shows expires_in %v, want 0", s[1].GetExpiresIn().AsDuration())
	}
	if f := ls.GetFetches(); len(f) != 1 || f[0].GetAge().AsDuration() != 2*time.Second || f[0].GetPhase() != "read" {
		t.Fatalf("fetches %v", f)
	}

	rl, err := e.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: s[0].GetSessionId(), Operator: "alice@host"})
	if err != nil || rl.GetReleasedBlocks() != 3 {
		t.Fatalf("release: %v, %v", rl, err)
	}
	if op := e.locks.released[s[0].GetSessionId()]; op == "" || op[:10] != "alice@host" {
		t.Fatalf("operator passed as %q", op)
	}
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("%w: x", holder.ErrUnknownSession), codes.NotFound},
		{holder.ErrInvalidSessionID, codes.InvalidArgument},
	} {
		e.locks.err = tc.err
		if _, err := e.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: "x"}); status.Code(err) != tc.code {
			t.Errorf("%v → %v, want %s", tc.err, err, tc.code)
		}
	}

	e.conns.list = []conn.ConnInfo{{Peer: "p:1", RemoteNodeID: "n2", Role: "requester", State: "connected", QPs: 4,
		Since: e.now.Add(-time.Hour), NICs: []conn.NICInfo{{Name: "tcp0", QPs: 2, LocalQPNs: []uint32{0x100, 0x101}}}}}
	lc, err := e.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
	if err != nil || len(lc.GetConns()) != 1 {
		t.Fatalf("conns: %v, %v", lc, err)
	}
	c := lc.GetConns()[0]
	if c.GetState() != "connected" || c.GetRole() != "requester" || c.GetAge().AsDuration() != time.Hour ||
		len(c.GetNics()) != 1 || c.GetNics()[0].GetLocalQpns()[1] != 0x101 || c.GetRemoteNodeId() != "n2" {
		t.Fatalf("conn %v", c)
	}

	e.metrics.LockTimeouts.Add(2)
	e.metrics.FetchTotal.WithLabelValues(metrics.FetchOK).Add(5)
	e.metrics.FetchTotal.WithLabelValues(metrics.FetchError).Add(1)
	e.metrics.FetchTotal.WithLabelValues(metrics.FetchCanceled).Add(1)
	if _, err := put(t, e.local, hdr("ns", []byte{1}, 100, 0), data(make([]byte, 100))); err != nil {
		t.Fatal(err)
	}
	st, err := e.admin.Stats(ctx, &pegadv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNodeId() != "n1" || st.GetIncarnation() != "inc1" || st.GetTransport() != "tcp" || st.GetBlocks() != 1 ||
		st.GetPoolUsed() == 0 || st.GetPoolSize() != 2<<20 || st.GetSessionsActive() != 2 || st.GetLockedBlocks() != 7 ||
		st.GetLockTimeouts() != 2 || st.GetFetchesOk() != 5 || st.GetFetchesFailed() != 2 || st.GetQps() != 4 ||
		st.GetConns() != 1 || st.GetUptime().AsDuration() != time.Minute {
		t.Fatalf("stats %v", st)
	}
	v, err := e.admin.Version(ctx, &pegadv1.VersionRequest{})
	if err != nil || v.GetVersion() == "" || v.GetGoVersion() == "" || v.GetTransport() != "tcp" {
		t.Fatalf("version %v, %v", v, err)
	}
}
