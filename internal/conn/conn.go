// Package conn owns pegad's RDMA connections to peers: one AddrConnection
// per peer address (requester side) and one accepted connection per
// requester (holder side), each owning its per-NIC state (queue pairs, the
// remote memory snapshot from its handshake, a round-robin counter) and the
// session workers that drive its QPs.
//
// There is no map keyed by QPN anywhere: QPNs are unique only within one
// remote HCA. Invalidating a connection is one atomic removal from the
// manager's map; work in flight keeps its QPs until it finishes.
//
// API CONTRACT (implementation pending; signatures are fixed):
package conn

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/metrics"
)

// Error classes of the data path; callers branch with errors.Is.
var (
	// ErrConnectionBroken: the connection cannot carry more work (QP in
	// ERROR, peer dead, handshake failed). Only this class invalidates.
	ErrConnectionBroken = errors.New("conn: connection broken")
	// ErrSessionInvalidated: the QP's session was dropped before the batch
	// ran ("session invalidated before batch execution"). Connection class.
	ErrSessionInvalidated = errors.New("session invalidated before batch execution")
	// ErrRemoteMemory: an address is outside the peer's handshake snapshot.
	ErrRemoteMemory = errors.New("conn: remote memory not found in handshake snapshot")
	// ErrHandshakeRejected: the peer refused the handshake (retryable).
	ErrHandshakeRejected = errors.New("conn: handshake rejected")
	// ErrClosed: the manager is shut down.
	ErrClosed = errors.New("conn: manager closed")
)

// Dialer returns a peer-service client for a peer address.
type Dialer func(peer string) (pegadv1.PeerServiceClient, error)

// Options configure a Manager.
type Options struct {
	NodeID      string
	Incarnation string
	Transport   string       // provider name, sent in handshakes
	Devices     []ibv.Device // opened NICs, in order
	// Memory is the local pool, registered on every NIC.
	Memory     []byte
	QPsPerPeer int
	SQDepth    int // send queue depth per QP (default 256)
	Dial       Dialer
	Metrics    *metrics.Metrics
	Log        zerolog.Logger
	// HandshakeTimeout bounds one handshake (default 10s).
	HandshakeTimeout time.Duration
}

// ReadOp is one RDMA READ: Len bytes from the peer's RemoteAddr into local
// pool memory at LocalAddr (a virtual address inside Options.Memory).
type ReadOp struct {
	LocalAddr  uint64
	RemoteAddr uint64
	Len        uint64
	// NUMA of the remote segment (used to prefer a NIC); -1 unknown.
	NUMA int
}

// ConnInfo is a row of `pegactl conns list`.
type ConnInfo struct {
	Peer         string
	RemoteNodeID string
	Role         string // "requester" or "holder"
	State        string // "connecting", "connected", "invalidated"
	NICs         []NICInfo
	QPs          int
	Since        time.Time
}

// NICInfo is per-NIC detail of a connection.
type NICInfo struct {
	Name      string
	QPs       int
	LocalQPNs []uint32
}

// Manager is safe for concurrent use.
type Manager struct{}

func NewManager(opts Options) (*Manager, error) { panic("unimplemented") }

// Get returns a connected AddrConnection to peer, handshaking if needed
// (at most one handshake per peer in flight; concurrent callers wait).
func (m *Manager) Get(ctx context.Context, peer string) (*AddrConnection, error) {
	panic("unimplemented")
}

// Invalidate removes c (if it is still the current connection to its peer)
// and tears it down once in-flight work is done.
func (m *Manager) Invalidate(c *AddrConnection, reason error) { panic("unimplemented") }

// Accept is the holder side of RdmaHandshake.
func (m *Manager) Accept(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
	panic("unimplemented")
}

func (m *Manager) List() []ConnInfo { panic("unimplemented") }

// QPs is the actual number of live QPs across all connections.
func (m *Manager) QPs() int { panic("unimplemented") }

// Close invalidates every connection and waits for their workers.
func (m *Manager) Close() error { panic("unimplemented") }

// AddrConnection is one connection to a peer address.
type AddrConnection struct{}

func (c *AddrConnection) Peer() string { panic("unimplemented") }

// Read runs ops (spread over NICs and QPs) and returns when all completed
// or ctx is done. After an error or ctx expiry it returns only once every
// QP that could still write into the ops' local memory is in ERROR and
// drained, so the caller may reuse that memory at once.
// Errors: ErrConnectionBroken / ErrSessionInvalidated (wrapping an
// *ibv.StatusError where one applies), ErrRemoteMemory, ctx errors.
func (c *AddrConnection) Read(ctx context.Context, ops []ReadOp) error { panic("unimplemented") }
