// Package holder is the holder side of the peer protocol: the PeerService
// gRPC handlers (query+lock, release, renew, and the RdmaHandshake entry
// point, which it delegates to an Acceptor) and the LockTable of transfer
// sessions that pin blocks in the store while peers READ them.
//
// It owns every pin it takes on behalf of a peer and releases each exactly
// once (release, expiry, operator force-release, requester restart, or
// shutdown). It never touches block bytes, never frees memory itself (the
// store does, on the last unpin), and never runs goroutines of its own:
// expiry is driven from outside (the daemon's lease.Sweep calls ExpireBefore).
//
// Contract details a requester depends on:
//   - A request names at most MaxHashes (default 4096) distinct hashes of
//     1..64 bytes each; a repeated hash is InvalidArgument (the response is
//     1:1 with the request, so duplicates have no meaning).
//   - An unknown namespace or hash is not an error: it is listed in missing.
//     When nothing is found the answer is OK with an empty session id and
//     nothing is locked.
//   - Found blocks' slots count toward MaxResponseSlots (default 65536, to
//     stay under gRPC's 4 MiB default receive size); beyond it the query is
//     ResourceExhausted and nothing is locked.
//   - The requester's node id (requester.node_id, else the deprecated
//     requester_id) is required on query, release and renew; only that node
//     may release or renew the session (PermissionDenied otherwise).
//   - ReleaseTransferLock: was_live is true only for the call that ended a
//     live session. Since only the owner can release, end=ALREADY_RELEASED
//     means an earlier release by the same requester ended it while live
//     (a retry after a lost answer); EXPIRED, FORCE_RELEASED and
//     REQUESTER_RESTARTED mean the lock lapsed and what was read must be
//     discarded. A well-formed id the holder does not remember (tombstones
//     are bounded) is NotFound: treat it as not live.
//   - A session ends at its deadline, not at the sweeper's next tick: a
//     release after the deadline answers EXPIRED (was_live false), a
//     renewal or operator force-release after it is NotFound, and listings
//     leave it out, whether or not the sweeper has run.
//   - A query that pins nothing creates no per-requester state.
//   - RenewTransferLock: NotFound when the session is not live (the
//     message says expired/released/... when remembered);
//     FailedPrecondition when its maximum lifetime is used up (it stays live
//     until its current deadline) or the incarnation is stale.
//   - RdmaDisconnect is best effort and idempotent: it frees the holder's
//     side of the connection that requester node made with that handshake
//     id, and nothing else (an unknown, replaced or foreign handshake is OK
//     with qps_released 0). It does not observe the incarnation (it must
//     not reclaim sessions). Unavailable without an Acceptor, Unimplemented
//     when the Acceptor cannot disconnect.
//   - An incarnation the holder has seen replaced by a newer one of the
//     same node is stale: FailedPrecondition on every RPC.
//   - With Options.Authenticate (peer mTLS) the session owner is the
//     certificate identity; a claimed node id the certificate does not
//     prove is PermissionDenied on every RPC, before any state changes.
//   - A query that would take its peer or the node past Options.Limits is
//     ResourceExhausted naming the limit, and nothing is locked.
//   - Every refusal carries a pegaderr reason beside its code (StatusKinds),
//     so kinds that share a code are told apart: STALE_INCARNATION and
//     LIFETIME_EXHAUSTED are both FailedPrecondition.
package holder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Pinner is the part of *store.Store the holder uses: PinChain pins a
// query's found blocks in one call (store.Store.PinChain), and Unpin
// gives a session's pins back.
type Pinner interface {
	PinChain(ns string, hashes [][]byte) (pinned []*store.Block, missing []int)
	Unpin(blocks []*store.Block)
}

// Handoffs is what the holder needs of the node's handoffs
// (*handoff.Table): end the pins of blocks a consumer has pulled, and the
// whole handoff once its consumer is done (EndHandoff). A token naming no
// live handoff changes nothing.
type Handoffs interface {
	Pulled(token string, keys []store.Key) int
	Done(token string) (ended bool, blocks int, err error)
}

// maxHandoffToken bounds the token a session keeps: a well-formed one is
// 48 characters; longer ones cannot name a handoff and are not kept.
const maxHandoffToken = 64

// handoffOf is the token a session keeps for a query's handoff_token
// ("": none, or no handoffs here, or one too long to name any).
func (s *Service) handoffOf(tok string) string {
	if s.opts.Handoffs == nil || len(tok) > maxHandoffToken {
		return ""
	}
	return tok
}

// Acceptor is the accept side of RdmaHandshake (internal/conn.Acceptor). It
// should return gRPC status errors; other errors become codes.Internal
// (context errors keep their codes).
type Acceptor interface {
	Accept(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error)
}

// Disconnector is the optional release side of RdmaDisconnect. An Acceptor
// that implements it (internal/conn.Acceptor does) lets a requester free the
// holder's side of a connection it abandoned; it follows Acceptor's error
// conventions.
type Disconnector interface {
	Disconnect(ctx context.Context, req *pegadv1.RdmaDisconnectRequest) (*pegadv1.RdmaDisconnectResponse, error)
}

// Windows binds a lock's memory windows (internal/conn.Acceptor with
// --memory-windows): over the segments of blocks, for the requester's
// accepted connection. It returns the answer's windows, the handshake they
// are bound on, and unbind, which invalidates them (the holder calls it
// once, before the blocks are unpinned). Invalidation fails closed: an
// unbind that returns an error could not prove the windows invalid, and
// the holder then keeps the blocks pinned for good (quarantine.go); so
// does a BindLock error for which errors.As finds a LiveWindows.
type Windows interface {
	BindLock(ctx context.Context, node, inc string, blocks []*pegadv1.BlockLocation) (
		windows []*pegadv1.MemoryWindows, handshakeID string, unbind func() error, err error)
}

// LiveWindows is an error of Windows saying that windows may still be
// valid over the blocks of the lock (internal/conn.InvalidationError).
type LiveWindows interface {
	error
	WindowsLive() bool
}

// Defaults and bounds.
const (
	DefaultLockTimeout      = 120 * time.Second
	DefaultMaxHashes        = limits.MaxBlocksPerRequest
	DefaultTombstones       = 1 << 16
	DefaultMaxRequesters    = 1 << 14
	DefaultMaxResponseSlots = 1 << 16 // ~2 MiB of slots, under gRPC's 4 MiB client default
	MaxNodeIDLen            = 256
	MaxIncarnationLen       = 128
)

// Options configure New. Zero values take the defaults, except Metrics,
// which is required (the daemon's, on the registry /metrics serves).
type Options struct {
	Store    Pinner
	Acceptor Acceptor // nil: RdmaHandshake answers Unavailable
	// Windows: locks are read through memory windows bound on their
	// requester's connection (nil: through the pool's rkey).
	Windows     Windows
	Metrics     *metrics.Metrics // required
	Log         zerolog.Logger
	NodeID      string
	Incarnation string
	LockTimeout time.Duration // default 120s
	MaxLifetime time.Duration // renew bound; default 10*LockTimeout, at least LockTimeout
	MaxHashes   int           // per query; default 4096
	Now         func() time.Time

	// Additive knobs (zero = default).
	Tombstones       int // ended session ids remembered for idempotent release; default 65536
	MaxRequesters    int // requester nodes tracked before idle ones are forgotten; default 16384
	MaxResponseSlots int // slots one query may return; default 65536 (ResourceExhausted beyond)

	// Limits bound what peers may pin (zero: unlimited).
	Limits Limits
	// Handoffs are this node's P/D handoffs (internal/handoff): a session
	// whose query named one of their tokens and that is released after a
	// complete read ends the handoff's pin of its blocks. Nil: tokens are
	// ignored.
	Handoffs Handoffs
	// Authenticate, when set (peer mTLS), makes the certificate identity
	// the owner of sessions and the subject of Limits; a request claiming
	// another node id is PermissionDenied. Nil: the claimed id is trusted.
	Authenticate Authenticator
}

func (o *Options) setDefaults() {
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.MaxLifetime <= 0 {
		o.MaxLifetime = 10 * o.LockTimeout
	}
	if o.MaxLifetime < o.LockTimeout {
		o.MaxLifetime = o.LockTimeout
	}
	if o.MaxHashes <= 0 {
		o.MaxHashes = DefaultMaxHashes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Tombstones <= 0 {
		o.Tombstones = DefaultTombstones
	}
	if o.MaxRequesters <= 0 {
		o.MaxRequesters = DefaultMaxRequesters
	}
	if o.MaxResponseSlots <= 0 {
		o.MaxResponseSlots = DefaultMaxResponseSlots
	}
}

// Service implements pegadv1.PeerServiceServer.
type Service struct {
	pegadv1.UnimplementedPeerServiceServer
	opts  Options
	locks *LockTable
}

var _ pegadv1.PeerServiceServer = (*Service)(nil)

// ErrNoMetrics is New's error for Options without Metrics.
var ErrNoMetrics = errors.New("holder: Metrics is required")

// New creates the service. opts.Store and opts.Metrics must be set.
func New(opts Options) (*Service, error) {
	if opts.Metrics == nil {
		return nil, ErrNoMetrics
	}
	opts.setDefaults()
	return &Service{opts: opts, locks: newLockTable(opts)}, nil
}

// Locks is the service's lock table (admin listing, force release, gc).
func (s *Service) Locks() *LockTable { return s.locks }

// ObserveIncarnation is LockTable.ObserveIncarnation.
func (s *Service) ObserveIncarnation(nodeID, incarnation string) (int, error) {
	return s.locks.ObserveIncarnation(nodeID, incarnation)
}

// done records the outcome of rpc and turns a panic into codes.Internal.
// Deferred first thing in each handler with the named error result.
func (s *Service) done(rpc string, err *error) {
	if r := recover(); r != nil {
		s.opts.Log.Error().Str("rpc", rpc).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("Holder RPC panicked")
		*err = status.Errorf(codes.Internal, "internal error in %s", rpc)
	}
	s.opts.Metrics.HolderRPC.WithLabelValues(rpc, status.Code(*err).String()).Inc()
}

// RecoveryInterceptor turns a panic in any unary handler into
// codes.Internal and logs it with its stack, so no input can crash the
// daemon. Install it on every gRPC server.
func RecoveryInterceptor(log zerolog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error().Str("method", info.FullMethod).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("gRPC handler panicked")
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}

// StatusKinds is how the holder's errors go on the wire (pegaderr): the
// peer service answers with it, and the admin API's force-release too.
var StatusKinds = []pegaderr.Kind{
	{Err: ErrInvalidSessionID, Code: codes.InvalidArgument, Reason: pegaderr.InvalidSessionID},
	{Err: ErrUnknownSession, Code: codes.NotFound, Reason: pegaderr.UnknownSession},
	{Err: ErrSessionEnded, Code: codes.NotFound, Reason: pegaderr.SessionEnded},
	{Err: ErrNotOwner, Code: codes.PermissionDenied, Reason: pegaderr.NotOwner},
	{Err: ErrIdentity, Code: codes.PermissionDenied, Reason: pegaderr.Identity},
	{Err: ErrLimit, Code: codes.ResourceExhausted, Reason: pegaderr.Limit},
	{Err: ErrStaleIncarnation, Code: codes.FailedPrecondition, Reason: pegaderr.StaleIncarnation},
	{Err: ErrLifetimeExhausted, Code: codes.FailedPrecondition, Reason: pegaderr.LifetimeExhausted},
}

// toStatus is err on the wire, at the RPC boundary.
func toStatus(err error) error { return pegaderr.ToStatus(err, StatusKinds) }

// requesterOf returns (node id, incarnation); requester wins over the
// deprecated requester_id.
func requesterOf(r *pegadv1.Requester, legacyID string) (string, string, error) {
	node, inc := r.GetNodeId(), r.GetIncarnation()
	if node == "" {
		node = legacyID
	}
	switch {
	case node == "":
		return "", "", errors.New("requester node_id is required (requester.node_id or requester_id)")
	case len(node) > MaxNodeIDLen:
		return "", "", fmt.Errorf("requester node_id is %d bytes, at most %d", len(node), MaxNodeIDLen)
	case len(inc) > MaxIncarnationLen:
		return "", "", fmt.Errorf("requester incarnation is %d bytes, at most %d", len(inc), MaxIncarnationLen)
	}
	return node, inc, nil
}

func invalid(format string, a ...any) error {
	return pegaderr.Status(codes.InvalidArgument, pegaderr.Invalid, fmt.Sprintf(format, a...)).Err()
}

// validateQuery checks everything before any state changes.
func (s *Service) validateQuery(req *pegadv1.QueryBlocksForTransferRequest) (node, inc string, err error) {
	ns, hashes := req.GetNamespace(), req.GetHashes()
	// The count first, against this holder's own cap (MaxHashes may be
	// below the protocol's), then the key checks every chain gets.
	switch {
	case len(hashes) == 0:
		return "", "", invalid("no hashes: want 1..%d", s.opts.MaxHashes)
	case len(hashes) > s.opts.MaxHashes:
		return "", "", invalid("%d hashes: at most %d per request", len(hashes), s.opts.MaxHashes)
	}
	if err := limits.ValidChain(ns, hashes); err != nil {
		return "", "", invalid("%v", err)
	}
	node, inc, err = requesterOf(req.GetRequester(), req.GetRequesterId())
	if err != nil {
		return "", "", invalid("%v", err)
	}
	if i, j, dup := firstRepeat(hashes); dup {
		return "", "", invalid("hash %d repeats hash %d: each hash at most once per request", i, j)
	}
	return node, inc, nil
}

// repeatSeed keys firstRepeat's hashing: per process, so that no request
// can be built to collide in it.
var repeatSeed = maphash.MakeSeed()

// firstRepeat finds the first hash that repeats an earlier one: i is its
// index and j the earlier one's. It probes an open-addressed table of
// indices (4 bytes a slot, at most half full) rather than building a map
// of strings: a 150-hash query spent more on that map than on pinning.
func firstRepeat(hashes [][]byte) (i, j int, dup bool) {
	size := 1
	for size < 2*len(hashes) {
		size <<= 1
	}
	table := make([]int32, size) // index+1 of the hash in each slot; 0: empty
	mask := uint64(size - 1)
	for i, h := range hashes {
		for at := maphash.Bytes(repeatSeed, h) & mask; ; at = (at + 1) & mask {
			e := table[at]
			if e == 0 {
				table[at] = int32(i + 1)
				break
			}
			if bytes.Equal(hashes[e-1], h) {
				return i, int(e - 1), true
			}
		}
	}
	return 0, 0, false
}

// QueryBlocksForTransfer pins the blocks the holder has under a new
// session. No block found: OK with an empty session id, nothing locked.
func (s *Service) QueryBlocksForTransfer(ctx context.Context, req *pegadv1.QueryBlocksForTransferRequest) (resp *pegadv1.QueryBlocksForTransferResponse, err error) {
	defer s.done(metrics.RPCQueryBlocks, &err)
	node, inc, err := s.validateQuery(req)
	if err != nil {
		return nil, err
	}
	if node, err = s.owner(ctx, node); err != nil {
		return nil, err
	}
	// A new incarnation reclaims the node's old sessions even when nothing
	// is found; a stale one is refused before anything is pinned. A node
	// not tracked yet is not added here: only a query that pins something
	// creates state (open).
	if _, err := s.locks.observeKnown(node, inc); err != nil {
		return nil, toStatus(err)
	}

	pinned, missing := s.opts.Store.PinChain(req.GetNamespace(), req.GetHashes())
	owned := true // this handler owns the pins until the lock table takes them
	defer func() {
		if owned && len(pinned) > 0 {
			s.opts.Store.Unpin(pinned)
		}
	}()

	resp = &pegadv1.QueryBlocksForTransferResponse{HolderIncarnation: s.opts.Incarnation,
		MaxPinnedBytesPerPeer: s.opts.Limits.PinnedBytesPerPeer, MaxPinnedBytes: s.opts.Limits.PinnedBytes}
	for _, i := range missing {
		resp.Missing = append(resp.Missing, req.Hashes[i])
	}
	if len(pinned) == 0 {
		s.opts.Metrics.EmptyQueries.Inc()
		return resp, nil
	}
	// isMissing: not in this answer's blocks (missing, or deferred to a
	// later window).
	isMissing := make([]bool, len(req.Hashes))
	for _, i := range missing {
		isMissing[i] = true
	}
	var deferred []int
	pinned, deferred = s.window(req.GetWindowBytes(), pinned, isMissing)
	for _, i := range deferred {
		resp.Deferred = append(resp.Deferred, req.Hashes[i])
	}
	var bytes uint64
	if resp.Blocks, bytes, err = s.locations(req.Hashes, pinned, isMissing); err != nil {
		return nil, err
	}

	unbind, err := s.bindWindows(ctx, node, inc, resp)
	if err != nil {
		if isLive(err) { // a window may be valid over the blocks: never unpinned
			s.locks.quarantine(node, "", pinned, bytes, err, false)
			owned = false
		}
		return nil, pegaderr.Status(codes.Unavailable, pegaderr.Connection, "memory windows: "+err.Error()).Err()
	}
	sess, err := s.locks.openQuery(node, inc, grant{query: req.GetQueryId(), blocks: pinned, bytes: bytes,
		unbind: unbind, handoff: s.handoffOf(req.GetHandoffToken())})
	if err != nil {
		if unbind != nil {
			if uerr := unbind(); uerr != nil { // before the deferred unpin
				s.locks.quarantine(node, "", pinned, bytes, uerr, false)
				owned = false
			}
		}
		return nil, toStatus(err)
	}
	owned = false
	// A caller that gave up (cancelled, or past its deadline) cannot be
	// delivered the answer and will never learn the id: end the session
	// now, counted as abandoned, rather than pin its blocks until expiry.
	// (An answer lost after this check is the requester's to notice; the
	// lock timeout bounds it.)
	if err := ctx.Err(); err != nil {
		if s.locks.end(sess, EndAbandoned) {
			s.opts.Log.Info().Stringer("session", sess.id).Str("requester", node).Int("blocks", len(pinned)).
				AnErr("cause", err).Msg("Transfer lock abandoned: its query's caller had gone")
		}
		return nil, toStatus(err)
	}
	resp.SessionId = sess.id.String()
	resp.LockTimeout = durationpb.New(time.Duration(sess.deadline() - sess.created))
	resp.ExpiresAt = timestamppb.New(s.locks.clock.At(sess.deadline()))
	s.opts.Log.Debug().Str("session", resp.SessionId).Str("requester", node).Int("blocks", len(pinned)).
		Int("missing", len(missing)).Msg("Transfer lock taken")
	return resp, nil
}

// bindWindows binds the memory windows of resp's blocks (Options.Windows)
// and puts their keys in resp; unbind is nil when there are none. Its
// error is BindLock's, for the caller to check (isLive) and answer
// Unavailable (CONNECTION).
func (s *Service) bindWindows(ctx context.Context, node, inc string, resp *pegadv1.QueryBlocksForTransferResponse) (unbind func() error, err error) {
	if s.opts.Windows == nil {
		return nil, nil
	}
	resp.Windows, resp.WindowsHandshakeId, unbind, err = s.opts.Windows.BindLock(ctx, node, inc, resp.Blocks)
	if err != nil {
		s.opts.Log.Warn().Err(err).Str("remote_node", node).Int("blocks", len(resp.Blocks)).Msg("memory windows not bound: lock refused")
		return nil, err
	}
	return unbind, nil
}

// locations lays out the answer's blocks: pinned, in request order (the
// hashes not marked in isMissing), and the bytes they take.
func (s *Service) locations(hashes [][]byte, pinned []*store.Block, isMissing []bool) ([]*pegadv1.BlockLocation, uint64, error) {
	var bytes uint64
	nslots, nsegs := 0, 0
	for _, b := range pinned {
		nslots += b.NumSlots()
		if nslots > s.opts.MaxResponseSlots {
			return nil, 0, pegaderr.Status(codes.ResourceExhausted, pegaderr.Limit, fmt.Sprintf(
				"found blocks have more than %d slots in all: ask for fewer hashes", s.opts.MaxResponseSlots)).Err()
		}
		for k := range b.NumSlots() {
			nsegs++
			if b.Slot(k).V.Len > 0 {
				nsegs++
			}
		}
		bytes += b.Size()
	}
	// The answer's messages come from a few arrays, not one allocation per
	// block, slot and segment: a query of 150 blocks would make 750.
	var (
		locs     = make([]pegadv1.BlockLocation, len(pinned))
		slots    = make([]pegadv1.Slot, nslots)
		slotPtrs = make([]*pegadv1.Slot, nslots)
		segs     = make([]pegadv1.Segment, nsegs)
	)
	segment := func(g store.Segment) *pegadv1.Segment {
		p := &segs[0]
		segs = segs[1:]
		p.Addr, p.Size, p.NumaNode = g.Addr, g.Len, int32(g.NUMA)
		return p
	}
	out := make([]*pegadv1.BlockLocation, 0, len(pinned))
	j := 0
	for i := range isMissing {
		if isMissing[i] {
			continue
		}
		b := pinned[j]
		loc := &locs[j]
		j++
		loc.Hash = hashes[i]
		loc.Slots, slotPtrs = slotPtrs[:b.NumSlots():b.NumSlots()], slotPtrs[b.NumSlots():]
		for k := range loc.Slots {
			sl := b.Slot(k)
			ps := &slots[0]
			slots = slots[1:]
			ps.K = segment(sl.K)
			if sl.V.Len > 0 {
				ps.V = segment(sl.V)
			}
			loc.Slots[k] = ps
		}
		out = append(out, loc)
	}
	return out, bytes, nil
}

// window keeps, of pinned (the found blocks, in request order), the
// longest prefix whose bytes fit in windowBytes, and at least one block;
// windowBytes is lowered to half the per-peer pin cap, so that a requester
// can read one window while it locks the next, and a window never has
// more slots than an answer may carry. It unpins the rest, marks them in
// isMissing and returns their request indices. windowBytes 0: no window.
func (s *Service) window(windowBytes uint64, pinned []*store.Block, isMissing []bool) ([]*store.Block, []int) {
	if windowBytes == 0 {
		return pinned, nil
	}
	if c := s.opts.Limits.PinnedBytesPerPeer; c > 0 {
		windowBytes = min(windowBytes, max(c/2, 1))
	}
	keep, bytes, slots := 0, uint64(0), 0
	for keep < len(pinned) {
		b := pinned[keep]
		if keep > 0 && (bytes+b.Size() > windowBytes || slots+b.NumSlots() > s.opts.MaxResponseSlots) {
			break
		}
		bytes += b.Size()
		slots += b.NumSlots()
		keep++
	}
	if keep == len(pinned) {
		return pinned, nil
	}
	s.opts.Store.Unpin(pinned[keep:])
	var deferred []int
	j := 0
	for i := range isMissing {
		if isMissing[i] {
			continue
		}
		if j >= keep {
			deferred = append(deferred, i)
			isMissing[i] = true
		}
		j++
	}
	return pinned[:keep], deferred
}

var sessionEnds = map[EndReason]pegadv1.SessionEnd{
	EndReleased:      pegadv1.SessionEnd_SESSION_END_ALREADY_RELEASED,
	EndExpired:       pegadv1.SessionEnd_SESSION_END_EXPIRED,
	EndForceReleased: pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED,
	EndReclaimed:     pegadv1.SessionEnd_SESSION_END_REQUESTER_RESTARTED,
	EndShutdown:      pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED,
	EndAbandoned:     pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED, // the holder ended it; its requester never had the id
}

// ReleaseTransferLock unpins a live session, or reports how it ended.
func (s *Service) ReleaseTransferLock(ctx context.Context, req *pegadv1.ReleaseTransferLockRequest) (resp *pegadv1.ReleaseTransferLockResponse, err error) {
	defer s.done(metrics.RPCReleaseLock, &err)
	node, inc, err := requesterOf(req.GetRequester(), req.GetRequesterId())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if node, err = s.owner(ctx, node); err != nil {
		return nil, err
	}
	wire := req.GetSessionId()
	if wire == "" && req.GetQueryId() != 0 {
		// A requester that lost its query's answer releases by the query.
		var ok bool
		if wire, ok = s.locks.SessionOfQuery(node, req.GetQueryId()); !ok {
			return nil, status.Errorf(codes.NotFound, "no live session of %q opened by query %016x", node, req.GetQueryId())
		}
	}
	id, err := ParseSessionID(wire)
	if err != nil {
		return nil, toStatus(err)
	}
	r, err := s.locks.Release(id, node, inc)
	if err != nil {
		return nil, toStatus(err)
	}
	if r.WasLive {
		if r.Handoff != "" && req.GetReadComplete() {
			s.opts.Handoffs.Pulled(r.Handoff, r.Keys)
		}
		s.opts.Log.Debug().Str("session", id).Str("requester", node).Int("blocks", r.Released).
			Dur("age", r.Age).Msg("Transfer lock released")
		return &pegadv1.ReleaseTransferLockResponse{
			ReleasedBlocks: uint32(r.Released), WasLive: true, End: pegadv1.SessionEnd_SESSION_END_RELEASED,
		}, nil
	}
	if r.End != EndReleased {
		s.opts.Metrics.LockEndedNotLive.Inc()
		s.opts.Log.Info().Str("session", id).Str("requester", node).Stringer("end", r.End).
			Msg("Release of a transfer lock that had already ended")
	}
	return &pegadv1.ReleaseTransferLockResponse{End: sessionEnds[r.End]}, nil
}

// RenewTransferLock extends a live session, bounded by MaxLifetime.
func (s *Service) RenewTransferLock(ctx context.Context, req *pegadv1.RenewTransferLockRequest) (resp *pegadv1.RenewTransferLockResponse, err error) {
	defer s.done(metrics.RPCRenewLock, &err)
	id, err := ParseSessionID(req.GetSessionId())
	if err != nil {
		return nil, toStatus(err)
	}
	node, inc, err := requesterOf(req.GetRequester(), "")
	if err != nil {
		return nil, invalid("%v", err)
	}
	if node, err = s.owner(ctx, node); err != nil {
		return nil, err
	}
	expires, left, err := s.locks.Renew(id, node, inc)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pegadv1.RenewTransferLockResponse{
		ExpiresAt: timestamppb.New(expires), LifetimeLeft: durationpb.New(left),
	}, nil
}

// RdmaHandshake applies the requester's incarnation (a restarted peer's old
// sessions go at once; a stale one is refused) and delegates to the
// Acceptor.
func (s *Service) RdmaHandshake(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (resp *pegadv1.RdmaHandshakeResponse, err error) {
	defer s.done(metrics.RPCHandshake, &err)
	node := req.GetRequester().GetNodeId()
	if node == "" && s.opts.Authenticate != nil {
		return nil, invalid("requester node_id is required on an authenticated peer port")
	}
	if node != "" {
		if _, _, err := requesterOf(req.GetRequester(), ""); err != nil {
			return nil, invalid("%v", err)
		}
		// Who asks comes first (the one authentication of this call): a
		// stranger learns nothing, not even whether rdma is configured.
		if node, err = s.owner(ctx, node); err != nil {
			return nil, err
		}
	}
	if s.opts.Acceptor == nil {
		return nil, status.Error(codes.Unavailable, "rdma not configured")
	}
	if node != "" {
		if _, err := s.locks.ObserveIncarnation(node, req.GetRequester().GetIncarnation()); err != nil {
			return nil, toStatus(err)
		}
	}
	resp, err = s.opts.Acceptor.Accept(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// RdmaDisconnect hands a requester's abandoned connection to the
// Acceptor's Disconnector, which frees it only when node and handshake id
// match (see Disconnector).
func (s *Service) RdmaDisconnect(ctx context.Context, req *pegadv1.RdmaDisconnectRequest) (resp *pegadv1.RdmaDisconnectResponse, err error) {
	defer s.done(metrics.RPCDisconnect, &err)
	node, _, err := requesterOf(req.GetRequester(), "")
	if err != nil {
		return nil, invalid("%v", err)
	}
	if _, err := s.owner(ctx, node); err != nil {
		return nil, err
	}
	if req.GetHandshakeId() == "" {
		return nil, invalid("handshake_id is required")
	}
	if s.opts.Acceptor == nil {
		return nil, status.Error(codes.Unavailable, "rdma not configured")
	}
	d, ok := s.opts.Acceptor.(Disconnector)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "rdma disconnect not supported by this acceptor")
	}
	resp, err = d.Disconnect(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}
