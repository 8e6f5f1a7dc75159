package localapi

import (
	"context"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/handoff"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/version"
)

// Locks is the holder's lock table as the admin API uses it
// (*holder.LockTable).
type Locks interface {
	SessionsPage(cursor uint64, limit int) ([]holder.SessionInfo, uint64)
	ForceRelease(id, operator string) (int, error)
	Len() int
	LockedBlocks() int
}

// Conns is the connections as the admin API lists them (conn.Listing: both
// halves of internal/conn).
type Conns interface {
	List() []conn.ConnInfo
	QPs() int
}

// NodeInfo is the daemon's identity, for Stats and Version.
type NodeInfo struct {
	NodeID         string
	Incarnation    string
	Transport      string // the provider in use: "tcp" or "verbs"
	VerbsAvailable bool
	Started        time.Time
}

// AdminOptions configure NewAdmin. Fetcher and Conns may be nil.
type AdminOptions struct {
	Store   *store.Store
	Locks   Locks
	Conns   Conns
	Fetcher Fetcher
	// Handoffs are the node's pending P/D handoffs; nil: none listed.
	Handoffs *handoff.Table
	Metrics  *metrics.Metrics
	// Engine has the data socket's lookup counters; nil: none.
	Engine *metrics.Engine
	Node   NodeInfo
	Log    zerolog.Logger
	Now    func() time.Time // nil: time.Now
}

// Admin implements pegadv1.AdminServiceServer.
type Admin struct {
	pegadv1.UnimplementedAdminServiceServer
	o AdminOptions
}

// NewAdmin returns the AdminService server.
func NewAdmin(o AdminOptions) *Admin {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Admin{o: o}
}

// MaxLockedListLimit caps a ListSessions page that lists locked blocks.
const MaxLockedListLimit = 64

// ListSessions lists a page of the holder's live sessions (oldest first)
// and, on the first page, the requester's in-flight fetches.
func (a *Admin) ListSessions(_ context.Context, req *pegadv1.ListSessionsRequest) (*pegadv1.ListSessionsResponse, error) {
	cursor, err := parseCursor(req.GetCursor())
	if err != nil {
		return nil, err
	}
	limit := listLimit(req.GetLimit())
	if req.GetIncludeBlocks() {
		// A session locks up to 4096 blocks: smaller pages keep an answer
		// with every block listed well under the message limits.
		limit = min(limit, MaxLockedListLimit)
	}
	now := a.o.Now()
	resp := &pegadv1.ListSessionsResponse{
		Sessions: []*pegadv1.HolderSession{},
		Fetches:  []*pegadv1.Fetch{},
	}
	if a.o.Locks != nil {
		page, next := a.o.Locks.SessionsPage(cursor, limit)
		resp.NextCursor = formatCursor(next)
		for _, s := range page {
			var locked []*pegadv1.LockedBlock
			if req.GetIncludeBlocks() {
				for _, b := range s.Locked() {
					locked = append(locked, &pegadv1.LockedBlock{Namespace: b.Key.Namespace, Hash: []byte(b.Key.Hash), Bytes: b.Bytes})
				}
			}
			resp.Sessions = append(resp.Sessions, &pegadv1.HolderSession{
				Locked:               locked,
				SessionId:            s.ID,
				RequesterId:          s.RequesterID,
				RequesterIncarnation: s.Incarnation,
				Blocks:               uint32(s.Blocks),
				Bytes:                s.Bytes,
				CreatedAt:            timestamppb.New(s.CreatedAt),
				Age:                  durationpb.New(max(now.Sub(s.CreatedAt), 0)),
				ExpiresIn:            durationpb.New(max(s.ExpiresAt.Sub(now), 0)),
				Renewals:             uint32(s.Renewals),
				HandoffId:            handoff.ID(s.Handoff),
			})
		}
	}
	if a.o.Fetcher != nil && cursor == 0 {
		fetches := a.o.Fetcher.InFlight()
		if len(fetches) > MaxListLimit {
			fetches, resp.FetchesTruncated = fetches[:MaxListLimit], true
		}
		for _, f := range fetches {
			resp.Fetches = append(resp.Fetches, &pegadv1.Fetch{
				ReqId:     f.ReqID,
				Peer:      f.Peer,
				SessionId: f.SessionID,
				Blocks:    uint32(f.Blocks),
				Bytes:     f.Bytes,
				BytesDone: f.BytesDone,
				Age:       durationpb.New(max(now.Sub(f.Started), 0)),
				Phase:     f.Phase,
				HandoffId: handoff.ID(f.Handoff),
			})
		}
	}
	if a.o.Handoffs != nil && cursor == 0 {
		pending, _ := a.o.Handoffs.List(MaxListLimit)
		for _, h := range pending {
			resp.Handoffs = append(resp.Handoffs, &pegadv1.PendingHandoff{
				Id: h.ID, Namespace: h.Namespace, Blocks: uint32(h.Blocks), BlocksTotal: uint32(h.Total),
				Bytes: h.Bytes, Age: durationpb.New(h.Age), TtlLeft: durationpb.New(max(h.TTLLeft, 0)),
			})
		}
	}
	return resp, nil
}

// ReleaseLock force-releases a holder session for an operator.
func (a *Admin) ReleaseLock(ctx context.Context, req *pegadv1.ReleaseLockRequest) (*pegadv1.ReleaseLockResponse, error) {
	if a.o.Locks == nil {
		return nil, statusf(codes.Unavailable, pegaderr.Internal, "holder not running")
	}
	if strings.TrimSpace(req.GetSessionId()) == "" {
		return nil, invalidf("session_id is empty")
	}
	op := strings.TrimSpace(req.GetOperator())
	if op == "" {
		op = "unknown"
	}
	// The name is the client's claim; the kernel's SO_PEERCRED is not.
	if who := callerOf(ctx); who != "" {
		op += " (" + who + ")"
	}
	n, err := a.o.Locks.ForceRelease(req.GetSessionId(), op)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pegadv1.ReleaseLockResponse{ReleasedBlocks: uint32(n)}, nil
}

// ListConns lists peer connections (both roles).
func (a *Admin) ListConns(context.Context, *pegadv1.ListConnsRequest) (*pegadv1.ListConnsResponse, error) {
	resp := &pegadv1.ListConnsResponse{Conns: []*pegadv1.Conn{}}
	if a.o.Conns == nil {
		return resp, nil
	}
	now := a.o.Now()
	for _, c := range a.o.Conns.List() {
		pc := &pegadv1.Conn{
			Peer:            c.Peer,
			State:           c.State,
			Qps:             uint32(c.QPs),
			Age:             durationpb.New(max(now.Sub(c.Since), 0)),
			RemoteNodeId:    c.RemoteNodeID,
			RemoteAdvertise: c.RemoteAdvertise,
			Role:            c.Role,
		}
		for _, n := range c.NICs {
			pc.Nics = append(pc.Nics, &pegadv1.NicConn{Nic: n.Name, Qps: uint32(n.QPs), LocalQpns: n.LocalQPNs})
		}
		resp.Conns = append(resp.Conns, pc)
	}
	return resp, nil
}

// Stats summarises the node.
func (a *Admin) Stats(context.Context, *pegadv1.StatsRequest) (*pegadv1.StatsResponse, error) {
	st := a.o.Store.Stats()
	resp := &pegadv1.StatsResponse{
		NodeId:       a.o.Node.NodeID,
		Incarnation:  a.o.Node.Incarnation,
		Transport:    a.o.Node.Transport,
		PoolSize:     st.Pool.Size,
		PoolUsed:     st.Pool.Used,
		PoolFree:     st.Pool.Free,
		PoolLocked:   st.Pool.Locked,
		Blocks:       st.Blocks,
		PinnedBlocks: st.Pinned,
		Evictions:    st.Evictions,
		Uptime:       durationpb.New(max(a.o.Now().Sub(a.o.Node.Started), 0)),
	}
	for _, q := range a.o.Store.Quotas() {
		resp.Quotas = append(resp.Quotas, &pegadv1.NamespaceQuota{Prefix: q.Prefix, LimitBytes: q.Limit, UsedBytes: q.Used,
			Blocks: q.Blocks, Evictions: q.Evictions, Refusals: q.Refusals})
	}
	ps := a.o.Store.PolicyStats()
	resp.EvictionPolicy, resp.EvictionWeight, resp.EvictionSamples = ps.Policy, ps.Weight, ps.Samples
	if a.o.Engine != nil {
		resp.Lookups, resp.LookupHitBlocks, resp.LookupMissBlocks = a.o.Engine.Totals()
		resp.RecomputedBlocks = a.o.Engine.RecomputedTotal()
	}
	if a.o.Locks != nil {
		resp.SessionsActive = uint64(a.o.Locks.Len())
		resp.LockedBlocks = uint64(a.o.Locks.LockedBlocks())
	}
	if a.o.Conns != nil {
		resp.Qps = uint32(a.o.Conns.QPs())
		resp.Conns = uint32(len(a.o.Conns.List()))
	}
	if m := a.o.Metrics; m != nil {
		resp.LockTimeouts = uint64(metrics.Value(m.LockTimeouts))
		resp.FetchesOk = uint64(metrics.Value(m.FetchTotal.WithLabelValues(metrics.FetchOK)))
		var failed float64
		for _, s := range []string{metrics.FetchError, metrics.FetchCanceled, metrics.FetchDiscarded, metrics.FetchPanic} {
			failed += metrics.Value(m.FetchTotal.WithLabelValues(s))
		}
		resp.FetchesFailed = uint64(failed)
		resp.FetchBytes = uint64(metrics.Value(m.FetchBytes))
	}
	return resp, nil
}

// Version reports the build and the transport in use.
func (a *Admin) Version(context.Context, *pegadv1.VersionRequest) (*pegadv1.VersionResponse, error) {
	return &pegadv1.VersionResponse{
		Version:        version.Version,
		Commit:         version.CommitOrVCS(),
		GoVersion:      version.GoVersion(),
		Transport:      a.o.Node.Transport,
		VerbsAvailable: a.o.Node.VerbsAvailable,
	}, nil
}
