package clusterapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/index"
)

// stubIndex answers from fields; the Redis behaviour itself is tested in
// redisindex against a real server.
type stubIndex struct {
	index.Index
	nodes   []index.Node
	holders [][]index.Holder
	err     error
}

func (s *stubIndex) Nodes(context.Context) ([]index.Node, error) { return s.nodes, s.err }
func (s *stubIndex) Locate(_ context.Context, _ string, hs [][]byte) ([][]index.Holder, error) {
	if s.err != nil {
		return nil, s.err
	}
	return s.holders[:len(hs)], nil
}

// wantReason is the pegaderr reason of each code clusterapi answers.
var wantReason = map[codes.Code]pegaderr.Reason{
	codes.InvalidArgument:    pegaderr.Invalid,
	codes.FailedPrecondition: pegaderr.IndexDisabled,
	codes.Unavailable:        pegaderr.IndexUnavailable,
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	down := &stubIndex{err: fmt.Errorf("%w: nodes: dial tcp: refused", index.ErrUnavailable)}
	ok := &stubIndex{holders: [][]index.Holder{nil}}
	locate := func(ns string, hs ...[]byte) *pegadv1.LocateBlocksRequest {
		return &pegadv1.LocateBlocksRequest{Namespace: ns, Hashes: hs}
	}
	for _, tc := range []struct {
		name string
		idx  index.Index
		call func(*Server) error
		want codes.Code
	}{
		{"locate too many", ok, func(s *Server) error {
			_, err := s.LocateBlocks(ctx, locate("ns", make([][]byte, MaxHashes+1)...))
			return err
		}, codes.InvalidArgument},
		{"nodes standalone", nil, func(s *Server) error { _, err := s.ListNodes(ctx, nil); return err }, codes.FailedPrecondition},
		{"nodes redis down", down, func(s *Server) error { _, err := s.ListNodes(ctx, nil); return err }, codes.Unavailable},
		{"locate standalone", nil, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns", []byte("h"))); return err }, codes.FailedPrecondition},
		{"locate redis down", down, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns", []byte("h"))); return err }, codes.Unavailable},
		{"locate no namespace", ok, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("", []byte("h"))); return err }, codes.InvalidArgument},
		{"locate no hashes", ok, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns")); return err }, codes.InvalidArgument},
		{"locate empty hash", ok, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns", nil)); return err }, codes.InvalidArgument},
		{"locate long hash", ok, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns", make([]byte, 65))); return err }, codes.InvalidArgument},
		{"locate ok", ok, func(s *Server) error { _, err := s.LocateBlocks(ctx, locate("ns", []byte("h"))); return err }, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(New(tc.idx, "me"))
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
			// Every refusal carries its pegaderr reason, which clients
			// branch on.
			if _, reason := pegaderr.FromStatus(err); err != nil && reason != wantReason[tc.want] {
				t.Fatalf("%v: reason %q, want %q", err, reason, wantReason[tc.want])
			}
		})
	}
}

func TestListNodes(t *testing.T) {
	started := time.Now().Add(-time.Minute)
	s := New(&stubIndex{nodes: []index.Node{
		{ID: "me", Addr: "10.0.0.1:50055", Incarnation: "i1", Transport: "verbs", PoolSize: 1 << 30, FreeBytes: 1 << 29, Started: started, Expires: time.Now().Add(5 * time.Second)},
		{ID: "other", Addr: "10.0.0.2:50055", Incarnation: "i2"},
	}}, "me")
	res, err := s.ListNodes(context.Background(), &pegadv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := res.GetNodes()
	if len(n) != 2 || !n[0].GetSelf() || n[1].GetSelf() || n[0].GetPoolSize() != 1<<30 || n[0].GetFreeBytes() != 1<<29 ||
		!n[0].GetStartedAt().AsTime().Equal(started) || n[0].GetExpiresIn().AsDuration() <= 0 || n[0].GetExpiresIn().AsDuration() > 5*time.Second {
		t.Fatalf("nodes %v", n)
	}
}
