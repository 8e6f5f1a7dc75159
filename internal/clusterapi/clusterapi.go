// Package clusterapi serves ClusterService on the local socket: what the
// cluster index says about nodes and blocks, for pegactl `nodes list` and
// `blocks where`. It translates index answers and errors to the API and
// owns no state; it never writes to the index.
package clusterapi

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/index"
)

// MaxHashes caps one LocateBlocks (as a prefetch).
const MaxHashes = limits.MaxBlocksPerRequest

// lookupTimeout bounds one answer when the caller's deadline is later:
// a down Redis must fail fast.
const lookupTimeout = 3 * time.Second

// Server implements pegadv1.ClusterServiceServer.
type Server struct {
	pegadv1.UnimplementedClusterServiceServer
	idx  index.Index // nil: the node runs standalone
	self string
}

// New serves idx (nil: every call answers FailedPrecondition) for the
// node named self.
func New(idx index.Index, self string) *Server { return &Server{idx: idx, self: self} }

// statusKinds is how the index's errors go on the wire (pegaderr).
var statusKinds = []pegaderr.Kind{
	{Err: index.ErrUnavailable, Code: codes.Unavailable, Reason: pegaderr.IndexUnavailable},
	{Err: index.ErrDisabled, Code: codes.FailedPrecondition, Reason: pegaderr.IndexDisabled},
}

func toStatus(err error) error { return pegaderr.ToStatus(err, statusKinds) }

// invalidf is the status of a malformed request: InvalidArgument with
// reason INVALID, as every local-socket API answers one (localapi).
func invalidf(format string, a ...any) error {
	return pegaderr.Status(codes.InvalidArgument, pegaderr.Invalid, fmt.Sprintf(format, a...)).Err()
}

func (s *Server) ready(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.idx == nil {
		return nil, nil, toStatus(index.ErrDisabled)
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	return ctx, cancel, nil
}

// ListNodes lists the live nodes, this one marked.
func (s *Server) ListNodes(ctx context.Context, _ *pegadv1.ListNodesRequest) (*pegadv1.ListNodesResponse, error) {
	ctx, cancel, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	nodes, err := s.idx.Nodes(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pegadv1.ListNodesResponse{}
	now := time.Now()
	for _, n := range nodes {
		cn := &pegadv1.ClusterNode{
			NodeId: n.ID, Advertise: n.Addr, Incarnation: n.Incarnation, Transport: n.Transport,
			PoolSize: n.PoolSize, FreeBytes: n.FreeBytes, Self: n.ID == s.self,
		}
		if !n.Started.IsZero() {
			cn.StartedAt = timestamppb.New(n.Started)
		}
		if !n.Expires.IsZero() {
			cn.ExpiresIn = durationpb.New(max(n.Expires.Sub(now), 0))
		}
		out.Nodes = append(out.Nodes, cn)
	}
	return out, nil
}

// LocateBlocks says which live nodes hold each hash.
func (s *Server) LocateBlocks(ctx context.Context, req *pegadv1.LocateBlocksRequest) (*pegadv1.LocateBlocksResponse, error) {
	ns, hashes := req.GetNamespace(), req.GetHashes()
	if len(hashes) == 0 {
		return nil, invalidf("no hashes (want 1..%d)", MaxHashes)
	}
	if err := limits.ValidChain(ns, hashes); err != nil {
		return nil, invalidf("%v", err)
	}
	ctx, cancel, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	found, err := s.idx.Locate(ctx, ns, hashes)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pegadv1.LocateBlocksResponse{}
	for i, h := range hashes {
		bh := &pegadv1.BlockHolders{Hash: h}
		for _, ho := range found[i] {
			bh.Holders = append(bh.Holders, &pegadv1.BlockHolder{NodeId: ho.NodeID, Advertise: ho.Addr, Incarnation: ho.Incarnation})
		}
		out.Blocks = append(out.Blocks, bh)
	}
	return out, nil
}
