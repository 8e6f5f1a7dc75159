package requester

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// --- fake holder: a pegadv1.PeerServiceClient that keeps a session table ---

type fakeSession struct {
	owner     string // requester node id of the query that opened it
	releases  int    // successful ReleaseTransferLock calls
	firstLive bool
	renewals  int
	expired   bool
	bytes     uint64 // what it pins, counted against pinCap
	query     uint64 // the query id that opened it
}

type fakeHolder struct {
	lockTimeout time.Duration
	// shape gives a block's slots (K, V sizes; V 0 = contiguous) and NUMA
	// node; ok false = holder does not have it. Default: 2 slots of 4 KiB K/V.
	shape func(hash string) (slots []store.SlotSize, numa int, ok bool)
	// Fault injection; nil = none.
	queryErr  func() error
	queryHook func(ctx context.Context) // runs first in each query (may block)
	// releaseLost: the release is executed, then its reply is lost.
	releaseLost func(sid string, attempt int) bool
	releaseErr  func(sid string, attempt int) error
	renewErr    func() error
	notLive     func(sid string) bool
	// pinCap is the per-peer pin cap (0: none): a query that would take
	// its requester's live sessions past it is refused (LIMIT). windows:
	// the holder windows a query (window_bytes, lowered to pinCap/2) and
	// states its cap, as the real one; without, it is an older holder.
	pinCap  uint64
	windows bool

	mu        sync.Mutex // guards everything below
	nextAddr  uint64
	nextSID   int
	sessions  map[string]*fakeSession
	queryOK   int
	releaseOK int // releases of a live session (first release)
	attempts  map[string]int
	maxLive   int   // most sessions live at once
	asked     []int // hashes each query named
}

func newFakeHolder() *fakeHolder {
	return &fakeHolder{
		lockTimeout: 2 * time.Minute,
		nextAddr:    1 << 40,
		sessions:    make(map[string]*fakeSession),
		attempts:    make(map[string]int),
	}
}

func (h *fakeHolder) QueryBlocksForTransfer(ctx context.Context, in *pegadv1.QueryBlocksForTransferRequest, _ ...grpc.CallOption) (*pegadv1.QueryBlocksForTransferResponse, error) {
	if h.queryHook != nil {
		h.queryHook(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if h.queryErr != nil {
		if err := h.queryErr(); err != nil {
			return nil, err
		}
	}
	if in.GetRequester().GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "no requester")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	resp := &pegadv1.QueryBlocksForTransferResponse{LockTimeout: durationpb.New(h.lockTimeout),
		ExpiresAt: timestamppb.New(time.Now().Add(h.lockTimeout))}
	h.asked = append(h.asked, len(in.GetHashes()))
	window := in.GetWindowBytes()
	if h.windows {
		resp.MaxPinnedBytesPerPeer = h.pinCap
		if h.pinCap > 0 && window > 0 {
			window = min(window, h.pinCap/2)
		}
	} else {
		window = 0
	}
	var bytes uint64
	for _, hash := range in.GetHashes() {
		slots, numa, ok := h.shapeOf(string(hash))
		if !ok {
			resp.Missing = append(resp.Missing, hash)
			continue
		}
		var size uint64
		for _, s := range slots {
			size += s.KSize + s.VSize
		}
		if window > 0 && len(resp.Blocks) > 0 && bytes+size > window {
			resp.Deferred = append(resp.Deferred, hash)
			continue
		}
		bytes += size
		loc := &pegadv1.BlockLocation{Hash: hash}
		for _, s := range slots {
			sl := &pegadv1.Slot{K: &pegadv1.Segment{Addr: h.nextAddr, Size: s.KSize, NumaNode: int32(numa)}}
			h.nextAddr += s.KSize
			if s.VSize > 0 {
				sl.V = &pegadv1.Segment{Addr: h.nextAddr, Size: s.VSize, NumaNode: int32(numa)}
				h.nextAddr += s.VSize
			}
			loc.Slots = append(loc.Slots, sl)
		}
		resp.Blocks = append(resp.Blocks, loc)
	}
	if len(resp.Blocks) > 0 {
		owner := in.GetRequester().GetNodeId()
		var pinned uint64
		live := 1
		for _, s := range h.sessions {
			if s.releases == 0 && !s.expired {
				live++
				if s.owner == owner {
					pinned += s.bytes
				}
			}
		}
		if h.pinCap > 0 && pinned+bytes > h.pinCap {
			return nil, pegaderr.Status(codes.ResourceExhausted, pegaderr.Limit, fmt.Sprintf(
				"limit reached: max-pinned-bytes-per-peer: peer pins %d, this query %d more, limit %d", pinned, bytes, h.pinCap)).Err()
		}
		h.maxLive = max(h.maxLive, live)
		h.nextSID++
		resp.SessionId = fmt.Sprintf("s-%d", h.nextSID)
		h.sessions[resp.SessionId] = &fakeSession{owner: owner, bytes: bytes, query: in.GetQueryId()}
	}
	h.queryOK++
	return resp, nil
}

func (h *fakeHolder) shapeOf(hash string) ([]store.SlotSize, int, bool) {
	if h.shape != nil {
		return h.shape(hash)
	}
	return []store.SlotSize{{KSize: 4096, VSize: 4096}, {KSize: 4096, VSize: 4096}}, 0, true
}

func (h *fakeHolder) ReleaseTransferLock(ctx context.Context, in *pegadv1.ReleaseTransferLockRequest, _ ...grpc.CallOption) (*pegadv1.ReleaseTransferLockResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	h.mu.Lock()
	h.attempts[in.GetSessionId()]++
	attempt := h.attempts[in.GetSessionId()]
	h.mu.Unlock()
	if h.releaseErr != nil {
		if err := h.releaseErr(in.GetSessionId(), attempt); err != nil {
			return nil, err
		}
	}
	resp, err := h.release(in)
	if err == nil && h.releaseLost != nil && h.releaseLost(in.GetSessionId(), attempt) {
		return nil, status.Error(codes.Unavailable, "reply lost")
	}
	return resp, err
}

func (h *fakeHolder) release(in *pegadv1.ReleaseTransferLockRequest) (*pegadv1.ReleaseTransferLockResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[in.GetSessionId()]
	if in.GetSessionId() == "" && in.GetQueryId() != 0 {
		// Release by query id, as the real holder: a live session only.
		for _, qs := range h.sessions {
			if qs.query == in.GetQueryId() && qs.releases == 0 && qs.owner == in.GetRequester().GetNodeId() {
				s, ok = qs, true
			}
		}
	}
	if !ok {
		return nil, status.Error(codes.NotFound, "no such session")
	}
	// As the real holder: only the owner releases (requester wins over the
	// deprecated requester_id).
	owner := in.GetRequester().GetNodeId()
	if owner == "" {
		owner = in.GetRequesterId()
	}
	if owner != s.owner {
		return nil, status.Errorf(codes.PermissionDenied, "session %s is owned by %q, not %q", in.GetSessionId(), s.owner, owner)
	}
	s.releases++
	if s.releases > 1 {
		return &pegadv1.ReleaseTransferLockResponse{End: pegadv1.SessionEnd_SESSION_END_ALREADY_RELEASED}, nil
	}
	h.releaseOK++
	live := !s.expired && (h.notLive == nil || !h.notLive(in.GetSessionId()))
	s.firstLive = live
	end := pegadv1.SessionEnd_SESSION_END_RELEASED
	if !live {
		end = pegadv1.SessionEnd_SESSION_END_EXPIRED
	}
	return &pegadv1.ReleaseTransferLockResponse{ReleasedBlocks: 1, WasLive: live, End: end}, nil
}

func (h *fakeHolder) RenewTransferLock(ctx context.Context, in *pegadv1.RenewTransferLockRequest, _ ...grpc.CallOption) (*pegadv1.RenewTransferLockResponse, error) {
	if h.renewErr != nil {
		if err := h.renewErr(); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[in.GetSessionId()]
	if !ok || s.releases > 0 {
		return nil, status.Error(codes.NotFound, "no live session")
	}
	// As the real holder: only the owner renews, and renew has no legacy id.
	if in.GetRequester().GetNodeId() != s.owner {
		return nil, status.Errorf(codes.PermissionDenied, "session %s is owned by %q, not %q",
			in.GetSessionId(), s.owner, in.GetRequester().GetNodeId())
	}
	s.renewals++
	return &pegadv1.RenewTransferLockResponse{ExpiresAt: timestamppb.New(time.Now().Add(h.lockTimeout)),
		LifetimeLeft: durationpb.New(time.Hour)}, nil
}

func (h *fakeHolder) RdmaHandshake(context.Context, *pegadv1.RdmaHandshakeRequest, ...grpc.CallOption) (*pegadv1.RdmaHandshakeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

// checkReleasedOnce asserts every session was released exactly once.
func (h *fakeHolder) checkReleasedOnce(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for sid, s := range h.sessions {
		if s.releases != 1 {
			t.Errorf("session %s released %d times, want exactly 1", sid, s.releases)
		}
	}
	if h.queryOK < len(h.sessions) || h.releaseOK != len(h.sessions) {
		t.Errorf("holder: query ok %d, sessions %d, release ok %d", h.queryOK, len(h.sessions), h.releaseOK)
	}
}

func (h *fakeHolder) counts() (sessions, releaseOK, renewals int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sessions {
		renewals += s.renewals
	}
	return len(h.sessions), h.releaseOK, renewals
}

// --- fake connections ---

type fakeReader struct {
	read func(ctx context.Context, ops []conn.ReadOp) error
	// selfReport: read reports its completions itself (conn.OpProgressOf).
	selfReport bool
}

func (r *fakeReader) Read(ctx context.Context, ops []conn.ReadOp) error {
	var err error
	if r.read != nil {
		err = r.read(ctx, ops)
	}
	// Report completed READs as conn.Read does (all of them on success).
	if p := conn.OpProgressOf(ctx); p != nil && err == nil && !r.selfReport {
		for i, op := range ops {
			p(i, op.Len)
		}
	}
	return err
}

type fakeConns struct {
	r      *fakeReader
	getErr error
	// getErrN, when set, fails the nth Get (from 1) with what it returns.
	getErrN func(n int) error

	mu          sync.Mutex // guards invalidated, gets
	invalidated []error
	gets        int
}

func (c *fakeConns) Get(ctx context.Context, _ string) (reader, error) {
	c.mu.Lock()
	c.gets++
	n := c.gets
	c.mu.Unlock()
	if c.getErrN != nil {
		if err := c.getErrN(n); err != nil {
			return nil, err
		}
	}
	if c.getErr != nil {
		return nil, c.getErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.r, nil
}

func (c *fakeConns) Invalidate(r reader, reason error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.invalidated = append(c.invalidated, reason)
}

func (c *fakeConns) invalidations() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.invalidated)
}

// --- fake store: fake addresses, real accounting ---

type fakeExtent struct {
	addr, n uint64
	refs    int
}

func (x *fakeExtent) Addr() uint64 { return x.addr }
func (x *fakeExtent) Len() uint64  { return x.n }

type fakeStore struct {
	capacity uint64
	// maxAlloc, when set, is the largest allocation (a NUMA part); larger
	// ones fail as the real store's do.
	maxAlloc uint64

	mu       sync.Mutex // guards everything below
	used     uint64
	next     uint64
	live     map[*fakeExtent]bool
	index    map[store.Key]*fakeExtent
	allocs   []uint64 // sizes asked of AllocStaging, in order
	problems []string
}

func newFakeStore(capacity uint64) *fakeStore {
	return &fakeStore{capacity: capacity, next: 1 << 20, live: map[*fakeExtent]bool{}, index: map[store.Key]*fakeExtent{}}
}

func (s *fakeStore) Has(key store.Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.index[key]
	return ok
}

func (s *fakeStore) MaxStaging() uint64 {
	if s.maxAlloc > 0 {
		return s.maxAlloc
	}
	return s.capacity
}

func (s *fakeStore) AllocStaging(n uint64) (extent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allocs = append(s.allocs, n)
	if s.maxAlloc > 0 && n > s.maxAlloc {
		return nil, fmt.Errorf("store: extent of %d bytes is larger than a NUMA part of the pool (%d): %w", n, s.maxAlloc, store.ErrNoSpace)
	}
	n = alignUp(n)
	if s.used+n > s.capacity {
		return nil, fmt.Errorf("store: alloc %d: %w", n, pool.ErrNoSpace)
	}
	x := &fakeExtent{addr: s.next, n: n, refs: 1}
	s.next += n
	s.used += n
	s.live[x] = true
	return x, nil
}

func (s *fakeStore) unref(x *fakeExtent) {
	if !s.live[x] {
		s.problems = append(s.problems, fmt.Sprintf("release of dead extent %#x", x.addr))
		return
	}
	x.refs--
	if x.refs == 0 {
		delete(s.live, x)
		s.used -= x.n
	}
}

func (s *fakeStore) ReleaseStaging(x extent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unref(x.(*fakeExtent))
}

func (s *fakeStore) Insert(key store.Key, x extent, slots []store.SlotLayout) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fx := x.(*fakeExtent)
	if !s.live[fx] {
		return false, fmt.Errorf("insert into dead extent")
	}
	for _, l := range slots {
		if l.KOff+l.KLen > fx.n || l.VOff+l.VLen > fx.n || l.KLen == 0 {
			return false, fmt.Errorf("%w: layout %+v outside extent of %d", store.ErrInvalid, l, fx.n)
		}
	}
	if _, ok := s.index[key]; ok {
		return false, nil
	}
	fx.refs++
	s.index[key] = fx
	return true, nil
}

func (s *fakeStore) Hold(key store.Key) (func(), uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.index[key]
	if !ok {
		return nil, 0, false
	}
	return func() {}, x.n, true
}

// covered reports whether [addr, addr+n) lies inside a live extent.
func (s *fakeStore) covered(addr, n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for x := range s.live {
		if addr >= x.addr && addr+n <= x.addr+x.n {
			return true
		}
	}
	return false
}

// stagingUsed is the bytes of live extents no indexed block references.
func (s *fakeStore) stagingUsed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	indexed := map[*fakeExtent]bool{}
	for _, x := range s.index {
		indexed[x] = true
	}
	var n uint64
	for x := range s.live {
		if !indexed[x] {
			n += x.n
		}
	}
	return n
}

func (s *fakeStore) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.problems {
		t.Error(p)
	}
	// Every live extent is referenced by exactly its indexed blocks.
	refs := map[*fakeExtent]int{}
	for _, x := range s.index {
		refs[x]++
	}
	for x := range s.live {
		if x.refs != refs[x] {
			t.Errorf("extent %#x: %d refs, %d indexed blocks (staging reference leaked)", x.addr, x.refs, refs[x])
		}
	}
}

func (s *fakeStore) allocSizes() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.allocs...)
}

func (h *fakeHolder) EndHandoff(context.Context, *pegadv1.EndHandoffRequest, ...grpc.CallOption) (*pegadv1.EndHandoffResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (h *fakeHolder) RdmaDisconnect(context.Context, *pegadv1.RdmaDisconnectRequest, ...grpc.CallOption) (*pegadv1.RdmaDisconnectResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}
