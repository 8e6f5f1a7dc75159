// Package requester is pegad's prefetch engine: it fetches blocks from a
// named peer into this node's pool. One fetch: ensure connected → lock the
// blocks on the holder (QueryBlocksForTransfer) → stage local memory →
// RDMA READ every segment → release the lock → index the blocks locally.
//
// Every lock it takes is released exactly once on every exit of a fetch
// (success, error, panic, cancellation, shutdown) by a release guard.
//
// API CONTRACT (implementation pending; signatures are fixed):
package requester

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// MaxChunk caps one staging extent (lesson 5).
const MaxChunk = 256 << 20

// PeerDialer returns a peer-service client for a peer address.
type PeerDialer func(peer string) (pegadv1.PeerServiceClient, error)

// Options configure an Engine.
type Options struct {
	NodeID      string
	Incarnation string
	Store       *store.Store
	Conns       *conn.Manager
	Peers       PeerDialer
	Metrics     *metrics.Metrics
	Log         zerolog.Logger
	// MaxChunk overrides MaxChunk (tests); 0 = MaxChunk.
	MaxChunk uint64
	// DefaultTimeout bounds a fetch when the caller gives none.
	DefaultTimeout time.Duration
}

// Status of one block in a fetch.
type Status int

const (
	StatusFetched Status = iota + 1
	StatusAlreadyLocal
	StatusMissingOnPeer
	StatusFailed
	StatusDiscarded
)

// BlockResult is the outcome for one requested hash.
type BlockResult struct {
	Hash   []byte
	Status Status
	Err    error
}

// Result of a fetch.
type Result struct {
	Blocks    []BlockResult
	Bytes     uint64
	Duration  time.Duration
	SessionID string
}

// FetchInfo is an in-flight fetch, for `pegactl sessions list`.
type FetchInfo struct {
	ReqID     string
	Peer      string
	SessionID string
	Blocks    int
	Bytes     uint64
	Started   time.Time
	Phase     string
}

// Engine is safe for concurrent use.
type Engine struct{}

func New(opts Options) (*Engine, error) { panic("unimplemented") }

// Prefetch fetches hashes of namespace from peer. The error is non-nil when
// the fetch as a whole failed; per-block outcomes are in Result.
func (e *Engine) Prefetch(ctx context.Context, peer, namespace string, hashes [][]byte) (*Result, error) {
	panic("unimplemented")
}

func (e *Engine) InFlight() []FetchInfo { panic("unimplemented") }

// Close cancels in-flight fetches (their guards release the locks) and
// waits for them.
func (e *Engine) Close() error { panic("unimplemented") }
