// Package localapi serves pegad's unix-socket APIs: LocalService (what the
// inference engine and pegactl use to put, get, list, delete and prefetch
// blocks) and AdminService (sessions, locks, connections, stats, version).
//
// It owns request validation and the mapping of internal errors to gRPC
// status codes (toStatus), and nothing else: it must never hold state of its
// own beyond what it is given, nor reach the network except through the
// prefetch engine.
package localapi

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/handoff"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// Limits of the local API.
const (
	// MaxChunk is the largest data payload of one PutBlock/GetBlock message.
	MaxChunk = 1 << 20
	// MaxRecvMsgSize is the gRPC receive limit the local server needs: one
	// MaxChunk plus room for framing and a header message.
	MaxRecvMsgSize = MaxChunk + 64<<10
	// DefaultPutIdleTimeout ends a PutBlock stream that sends nothing for
	// this long (LocalOptions.PutIdleTimeout).
	DefaultPutIdleTimeout = 30 * time.Second
	// MaxPutBufferBytes caps the default of LocalOptions.PutBufferBytes.
	MaxPutBufferBytes = 4 << 30
	// DefaultListLimit and MaxListLimit bound a page of ListBlocks and of
	// ListSessions; MaxListSlots bounds the slots of a ListBlocks page.
	// Together they keep a page well under gRPC's 4 MiB default.
	DefaultListLimit = 1000
	MaxListLimit     = limits.MaxBlocksPerRequest
	MaxListSlots     = 32768
	// MaxPrefetchHashes caps one Prefetch (the peer protocol's cap,
	// limits.ValidChain's).
	MaxPrefetchHashes = limits.MaxBlocksPerRequest
)

// Fetcher is the prefetch engine as the APIs use it (*requester.Engine).
type Fetcher interface {
	Fetch(ctx context.Context, r requester.Request) (*requester.Result, error)
	InFlight() []requester.FetchInfo
}

// Local implements pegadv1.LocalServiceServer.
type Local struct {
	pegadv1.UnimplementedLocalServiceServer

	store   *store.Store
	fetcher Fetcher // nil: Prefetch answers Unavailable
	// handoffs, self and advertise serve Handoff (nil handoffs: it
	// answers Unavailable).
	handoffs  *handoff.Table
	self      string
	advertise string
	log       zerolog.Logger
	now       func() time.Time
	idle      time.Duration // PutBlock stream idle timeout
	putBuf    *budget       // bytes PutBlock streams hold before their block is stored

	// poolUsers counts running handlers that touch pool memory; Wait
	// closes it and waits for them, so the pool is unmapped only after.
	poolUsers gate
}

// LocalOptions configure NewLocal.
type LocalOptions struct {
	Store   *store.Store
	Fetcher Fetcher
	// Handoffs are the node's P/D handoffs; NodeID and Advertise are what
	// a Handoff answer names (this node, its peer address as peers dial
	// it).
	Handoffs  *handoff.Table
	NodeID    string
	Advertise string
	Log       zerolog.Logger
	Now       func() time.Time // nil: time.Now
	// PutIdleTimeout ends a PutBlock stream that sends nothing for this
	// long (0: DefaultPutIdleTimeout).
	PutIdleTimeout time.Duration
	// PutBufferBytes bounds the bytes all PutBlock streams together hold
	// in memory while their data arrives (0: the pool's size, at most
	// MaxPutBufferBytes).
	PutBufferBytes uint64
}

// NewLocal returns the LocalService server.
func NewLocal(o LocalOptions) *Local {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.PutIdleTimeout <= 0 {
		o.PutIdleTimeout = DefaultPutIdleTimeout
	}
	if o.PutBufferBytes == 0 {
		o.PutBufferBytes = min(o.Store.Pool().Size(), MaxPutBufferBytes)
	}
	return &Local{
		store: o.Store, fetcher: o.Fetcher, log: o.Log, now: o.Now,
		handoffs: o.Handoffs, self: o.NodeID, advertise: o.Advertise,
		idle: o.PutIdleTimeout, putBuf: &budget{free: o.PutBufferBytes, size: o.PutBufferBytes},
	}
}

// Wait stops new PutBlock and GetBlock calls (they answer Unavailable)
// and returns once every running one has returned: after it, nothing
// here touches pool memory, so the pool may be unmapped. The daemon calls
// it after stopping the gRPC server, whose Stop does not wait for
// handlers.
func (l *Local) Wait() { l.poolUsers.closeAndWait() }

// gate counts the handlers that touch pool memory.
type gate struct {
	mu     sync.Mutex // guards closed and the Add side of wg
	closed bool
	wg     sync.WaitGroup
}

// enter admits a handler; false once closed.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *gate) leave() { g.wg.Done() }

func (g *gate) closeAndWait() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

var errShuttingDown = statusf(codes.Unavailable, pegaderr.Draining, "pegad is shutting down")

// validKey checks a namespace and hash against limits.ValidKey, as an
// InvalidArgument status.
func validKey(ns string, hash []byte) error {
	if err := limits.ValidKey(ns, hash); err != nil {
		return invalidf("%v", err)
	}
	return nil
}

// GetBlock streams a header, then the block's bytes.
func (l *Local) GetBlock(req *pegadv1.GetBlockRequest, stream pegadv1.LocalService_GetBlockServer) error {
	if err := validKey(req.GetNamespace(), req.GetHash()); err != nil {
		return err
	}
	if !l.poolUsers.enter() {
		return errShuttingDown
	}
	defer l.poolUsers.leave()
	key := store.Key{Namespace: req.GetNamespace(), Hash: string(req.GetHash())}
	// One pin, one block: the header and the bytes both come from it,
	// never from a second lookup by key.
	pinned, missing := l.store.Pin([]store.Key{key})
	if len(missing) > 0 || len(pinned) == 0 {
		return statusf(codes.NotFound, pegaderr.NotFound, "%v: namespace=%s hash=%x", store.ErrNotFound, key.Namespace, req.GetHash())
	}
	b := pinned[0]
	defer l.store.Unpin(pinned)

	hdr := blockHeader(b, l.now())
	if err := stream.Send(&pegadv1.GetBlockResponse{Msg: &pegadv1.GetBlockResponse_Header{Header: hdr}}); err != nil {
		return err
	}
	var sent uint64
	err := l.store.ReadPinned(b, func(chunk []byte) error {
		for len(chunk) > 0 {
			n := min(len(chunk), MaxChunk)
			if sent+uint64(n) > hdr.GetBytes() {
				return statusf(codes.Aborted, pegaderr.BlockChanged, "block changed while being read")
			}
			if err := stream.Send(&pegadv1.GetBlockResponse{Msg: &pegadv1.GetBlockResponse_Data{Data: chunk[:n]}}); err != nil {
				return err
			}
			sent += uint64(n)
			chunk = chunk[n:]
		}
		return nil
	})
	if err != nil {
		return toStatus(err)
	}
	if sent != hdr.GetBytes() {
		return statusf(codes.Aborted, pegaderr.BlockChanged, "block changed while being read (%d of %d bytes)", sent, hdr.GetBytes())
	}
	return nil
}

// blockHeader describes a block we hold one pin of (excluded from Pins).
func blockHeader(b *store.Block, now time.Time) *pegadv1.BlockInfo {
	k := b.Key()
	slots := b.Slots()
	info := &pegadv1.BlockInfo{
		Namespace:  k.Namespace,
		Hash:       []byte(k.Hash),
		Bytes:      b.Size(),
		Pins:       uint32(max(b.Pins()-1, 0)),
		CreatedAt:  timestamppb.New(b.CreatedAt()),
		LastAccess: timestamppb.New(now),
		NumaNode:   -1,
	}
	for _, s := range slots {
		info.Slots = append(info.Slots, &pegadv1.SlotSize{KSize: s.K.Len, VSize: s.V.Len})
	}
	if len(slots) > 0 {
		info.NumaNode = int32(slots[0].K.NUMA)
	}
	return info
}

// ListBlocks lists a page of blocks, newest first. The store is locked
// only to find the page; rows are built after.
func (l *Local) ListBlocks(_ context.Context, req *pegadv1.ListBlocksRequest) (*pegadv1.ListBlocksResponse, error) {
	// An empty namespace lists every namespace; any other is held to the
	// key rules, as no block could be stored under one that breaks them.
	if ns := req.GetNamespace(); ns != "" {
		if err := limits.ValidNamespace(ns); err != nil {
			return nil, invalidf("%v", err)
		}
	}
	if strings.HasPrefix(req.GetCursor(), lowerCursor) {
		before, err := parseLowerCursor(req.GetCursor())
		if err != nil {
			return nil, err
		}
		resp := &pegadv1.ListBlocksResponse{}
		l.appendLower(resp, req.GetNamespace(), before, listLimit(req.GetLimit()), MaxListSlots)
		return resp, nil
	}
	cursor, err := parseCursor(req.GetCursor())
	if err != nil {
		return nil, err
	}
	infos, next := l.store.ListPage(req.GetNamespace(), cursor, listLimit(req.GetLimit()), MaxListSlots)
	resp := &pegadv1.ListBlocksResponse{
		Truncated: next != 0, NextCursor: formatCursor(next),
		Blocks: make([]*pegadv1.BlockInfo, 0, len(infos)),
	}
	defer func() {
		// The pool's blocks are listed first, then the lower tier's.
		if next == 0 && l.store.HasLower() {
			slots := 0
			for _, in := range infos {
				slots += len(in.Slots)
			}
			if room := listLimit(req.GetLimit()) - len(infos); room > 0 && slots < MaxListSlots {
				l.appendLower(resp, req.GetNamespace(), 0, room, MaxListSlots-slots)
			} else {
				resp.Truncated, resp.NextCursor = true, lowerCursor
			}
		}
	}()
	for _, in := range infos {
		bi := &pegadv1.BlockInfo{
			Namespace:  in.Key.Namespace,
			Hash:       []byte(in.Key.Hash),
			Bytes:      in.Size,
			Pins:       uint32(in.Pins),
			CreatedAt:  timestamppb.New(in.CreatedAt),
			LastAccess: timestamppb.New(in.LastAccess),
			NumaNode:   int32(in.NUMA),
			Tier:       tierDRAM,
		}
		if l.store.OnLower(in.Key) {
			bi.Tier = tierDRAMSSD
		}
		for _, s := range in.Slots {
			bi.Slots = append(bi.Slots, &pegadv1.SlotSize{KSize: s.KSize, VSize: s.VSize})
		}
		resp.Blocks = append(resp.Blocks, bi)
	}
	return resp, nil
}

// Tier values of BlockInfo.tier.
const (
	tierDRAM    = "dram"
	tierDRAMSSD = "dram+ssd"
	tierSSD     = "ssd"
)

// lowerCursor starts the cursors of the lower tier's pages: "ssd" (from
// its newest block) or "ssd:SEQ" (before SEQ).
const lowerCursor = "ssd"

func parseLowerCursor(c string) (uint64, error) {
	rest := strings.TrimPrefix(c, lowerCursor)
	if rest == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(rest, ":"), 10, 64)
	if err != nil || n == 0 || !strings.HasPrefix(rest, ":") {
		return 0, status.Errorf(codes.InvalidArgument, "malformed cursor %q: pass next_cursor of an earlier page", c)
	}
	return n, nil
}

// appendLower adds a page of the blocks only on the lower tier (up to
// limit blocks and maxSlots slots, one block always) to resp, and sets
// its cursor.
func (l *Local) appendLower(resp *pegadv1.ListBlocksResponse, ns string, before uint64, limit, maxSlots int) {
	entries, next := l.store.LowerPage(ns, before, limit)
	resp.Truncated, resp.NextCursor = false, ""
	slots := 0
	for i, e := range entries {
		if slots += len(e.Slots); i > 0 && slots > maxSlots {
			next = entries[i-1].Seq
			break
		}
		bi := &pegadv1.BlockInfo{Namespace: e.Key.Namespace, Hash: []byte(e.Key.Hash), Bytes: e.Size, Tier: tierSSD}
		for _, s := range e.Slots {
			bi.Slots = append(bi.Slots, &pegadv1.SlotSize{KSize: s.KSize, VSize: s.VSize})
		}
		resp.Blocks = append(resp.Blocks, bi)
	}
	if next != 0 {
		resp.Truncated, resp.NextCursor = true, lowerCursor+":"+strconv.FormatUint(next, 10)
	}
}

// listLimit applies the default and the cap to a listing's page size.
func listLimit(n uint32) int {
	if n == 0 {
		return DefaultListLimit
	}
	return min(int(n), MaxListLimit)
}

// Cursors are opaque to clients; here they are a position in a listing's
// order (a decimal sequence number).
func parseCursor(c string) (uint64, error) {
	if c == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(c, 10, 64)
	if err != nil || n == 0 {
		return 0, invalidf("malformed cursor %q: pass next_cursor of an earlier page", c)
	}
	return n, nil
}

func formatCursor(n uint64) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatUint(n, 10)
}

// DeleteBlock removes a block from the index.
func (l *Local) DeleteBlock(ctx context.Context, req *pegadv1.DeleteBlockRequest) (*pegadv1.DeleteBlockResponse, error) {
	if err := validKey(req.GetNamespace(), req.GetHash()); err != nil {
		return nil, err
	}
	deferred, err := l.store.Delete(store.Key{Namespace: req.GetNamespace(), Hash: string(req.GetHash())})
	if err != nil {
		return nil, toStatus(err)
	}
	// An admin action: who did it, as the kernel says (SO_PEERCRED).
	withCaller(ctx, l.log.Info()).Str("namespace", req.GetNamespace()).Hex("hash", req.GetHash()).
		Bool("deferred", deferred).Msg("Block deleted")
	return &pegadv1.DeleteBlockResponse{Deferred: deferred}, nil
}

// Prefetch fetches blocks from a peer through the prefetch engine.
func (l *Local) Prefetch(ctx context.Context, req *pegadv1.PrefetchRequest) (*pegadv1.PrefetchResponse, error) {
	if l.fetcher == nil {
		return nil, statusf(codes.Unavailable, pegaderr.Internal, "prefetch engine not running")
	}
	// An empty peer asks the cluster index (requester.Cluster).
	hashes := req.GetHashes()
	if len(hashes) == 0 {
		// Nothing missing (hashes[hit.local:hit.n] of a cluster hit
		// this node already holds): nothing to fetch, no session.
		if err := limits.ValidNamespace(req.GetNamespace()); err != nil {
			return nil, invalidf("%v", err)
		}
		return &pegadv1.PrefetchResponse{}, nil
	}
	if err := limits.ValidChain(req.GetNamespace(), hashes); err != nil {
		return nil, invalidf("%v", err)
	}
	if t := req.GetTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() <= 0 {
			return nil, invalidf("timeout must be positive")
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.AsDuration())
		defer cancel()
	}
	// Blocks on this node's SSD tier come back from it, not from a peer:
	// the engine then finds them local.
	keys := make([]store.Key, len(hashes))
	for i, h := range hashes {
		keys[i] = store.Key{Namespace: req.GetNamespace(), Hash: string(h)}
	}
	l.store.Promote(keys)
	res, err := l.fetcher.Fetch(ctx, requester.Request{Peer: req.GetPeer(), Namespace: req.GetNamespace(), Hashes: hashes,
		Handoff: req.GetHandoffToken(), KnownPeerOnly: req.GetKnownPeerOnly(),
		EndHandoff: req.GetEndHandoff() && req.GetPeer() != ""})
	if err != nil {
		return failedPrefetch(res, err, req.GetFailureInResponse())
	}
	if res == nil {
		return nil, statusf(codes.Internal, pegaderr.Internal, "prefetch returned no result")
	}
	return prefetchResponse(res), nil
}
