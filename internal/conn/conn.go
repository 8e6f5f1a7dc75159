// Package conn owns pegad's RDMA connections to peers, in two halves over
// one NIC set:
//   - NICs (nicset.go, nic.go, fatal.go) owns the node's devices: the
//     per-NIC protection domains and memory registrations (one MR of the
//     pool per NIC), the keepalive pages, each NIC's holder CQ, the count
//     of live QPs, the NICs' port events and the reopening of a device
//     that reported DEVICE_FATAL. It is the one thing the halves share.
//   - Dialer (dialer.go, handshake.go, connection.go, worker.go, probe.go,
//     rail.go) is the requester side: one AddrConnection per peer address,
//     each owning its per-NIC state (queue pairs, the remote memory
//     snapshot from its handshake, a round-robin counter) and the session
//     workers that drive its QPs; the keepalive prober.
//   - Acceptor (acceptor.go, accept.go, reap.go, windows.go,
//     quarantine.go) is the holder side: one accepted connection per
//     requester, the retired generations of one that reconnected, the
//     reaper, and the memory windows of transfer locks.
//
// The requester imports the Dialer, the holder the Acceptor; the daemon
// makes the NIC set and both halves, and closes the halves before the
// NICs.
//
// There is no map keyed by QPN anywhere: QPNs are unique only within one
// remote HCA. Invalidating a connection is one atomic removal from its
// half's map; work in flight keeps its QPs until it finishes.
//
// The package must never know about blocks, transfer sessions (locks) or
// the pool's allocator: it moves bytes between registered memory ranges it
// is given, and nothing else.
package conn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/ibv"
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
	// ErrPeerRestarted: the peer answers with another incarnation than the
	// one this connection handshook with; its QPs and memory snapshot are
	// gone. Connection class: the caller invalidates and reconnects.
	ErrPeerRestarted = errors.New("conn: peer restarted since handshake")
	// ErrHandshakeRejected: the peer refused the handshake (retryable).
	ErrHandshakeRejected = errors.New("conn: handshake rejected")
	// ErrClosed: the Dialer, Acceptor or NIC set is shut down.
	ErrClosed = errors.New("conn: closed")
	// ErrInvalidHandshake: handshake metadata is malformed (a request in
	// Accept, or a response in Get). The holder's RPC layer maps it to
	// codes.InvalidArgument. It is not connection class on the holder.
	ErrInvalidHandshake = errors.New("conn: invalid handshake")
	// ErrInvalidOp: a ReadOp is malformed (zero length, local range outside
	// NICOptions.Memory). A caller bug or local error: never invalidates.
	ErrInvalidOp = errors.New("conn: invalid read op")
	// ErrNoActiveNIC: every local NIC's port is down, so no handshake can
	// build a QP that would carry a READ (wrapped in ErrConnectionBroken).
	ErrNoActiveNIC = errors.New("conn: no local NIC has an active port")
	// ErrRailDown: a READ failed because the port of the NIC it went
	// through is down (found by querying the port, as the failure can come
	// before the port's event). Like a flush it says nothing of the other
	// rails or the peer: a fresh connection, without that NIC, can carry
	// the READ again. Wraps the work completion's error.
	ErrRailDown = errors.New("conn: the NIC's port went down under the read")
	// ErrNoRail: a handshake's QPs could be connected on none of the
	// local NICs, each failing for a fault of its rail (RailFaultError,
	// one per rail tried, is in the chain). Wrapped in ErrConnectionBroken.
	ErrNoRail = errors.New("conn: no rail connects to the peer")
)

// IsConnectionClass reports whether err means the connection it came from
// must be invalidated (and a new handshake made before more work).
func IsConnectionClass(err error) bool {
	return errors.Is(err, ErrConnectionBroken) || errors.Is(err, ErrSessionInvalidated) ||
		errors.Is(err, ErrPeerRestarted)
}

// Placement is where local memory is, by NUMA node (*pool.Pool).
type Placement interface {
	// NodeOf is the node of the memory at a virtual address, -1 unknown.
	NodeOf(addr uint64) int
	// Nodes are the nodes the memory is on.
	Nodes() []int
}

const (
	defaultSQDepth           = 256
	defaultHandshakeTimeout  = 10 * time.Second
	defaultDisconnectTimeout = 2 * time.Second
	// maxQPsPerPeer bounds what a handshake may ask a holder to create.
	maxQPsPerPeer = limits.MaxQPsPerPeer
	// defaultSliceBytes: DialerOptions.SliceBytes.
	defaultSliceBytes = 1 << 20
	// drainTimeout bounds waiting for a QP in ERROR to flush; past it the
	// QP is destroyed, which guarantees no WR touches memory afterwards.
	drainTimeout = 30 * time.Second
	// invalidLogEvery: at most one "rejected malformed rdma handshake"
	// line per this, after the first (Acceptor.invalidLog).
	invalidLogEvery = 10 * time.Second
)

// ReadOp is one RDMA READ: Len bytes from the peer's RemoteAddr into local
// pool memory at LocalAddr (a virtual address inside NICOptions.Memory).
type ReadOp struct {
	LocalAddr  uint64
	RemoteAddr uint64
	Len        uint64
	// NUMA of the remote segment (used to prefer a NIC); -1 unknown.
	NUMA int
	// Grant: the memory windows of the lock that covers RemoteAddr (nil:
	// the holder serves it through its pool rkey). READs then go on the
	// NICs and QPs the grant names, with its keys.
	Grant *Grant
}

// ConnInfo is a row of `pegactl conns list`.
type ConnInfo struct {
	Peer         string
	RemoteNodeID string
	// RemoteAdvertise: holder rows, the requester's advertised address.
	RemoteAdvertise string
	Role            string // "requester" or "holder"
	State           string // "connecting", "connected", "invalidated"
	NICs            []NICInfo
	QPs             int
	Since           time.Time
}

// NICInfo is per-NIC detail of a connection.
type NICInfo struct {
	Name      string
	QPs       int
	LocalQPNs []uint32
}

// Roles and states, as labels of the Conns gauge and in ConnInfo.
const (
	RoleRequester     = "requester"
	RoleHolder        = "holder"
	StateConnecting   = "connecting"
	StateConnected    = "connected"
	StateInvalidated  = "invalidated"
	resultOK          = "ok"
	resultError       = "error"
	resultInvalid     = "invalid"
	resultRejected    = "rejected"
	resultUnreachable = "unreachable"
	// resultRailFault: a requester's handshake whose QPs on one NIC could
	// not be connected for a fault of its rail (it is made again without
	// that NIC).
	resultRailFault = "rail_fault"
)

func newHandshakeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reasonLabel turns an invalidation reason into a low-cardinality label.
func reasonLabel(err error) string {
	var se *ibv.StatusError
	switch {
	case err == nil:
		return "manual"
	case errors.Is(err, ErrClosed):
		return "shutdown"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &se):
		return "completion_error"
	case errors.Is(err, ErrSessionInvalidated):
		return "session_invalidated"
	case errors.Is(err, ErrConnectionBroken):
		return "connection_broken"
	case errors.Is(err, ErrPeerRestarted):
		return "peer_restarted"
	case errors.Is(err, ErrRemoteMemory):
		return "remote_memory"
	}
	return "other"
}

// wcLabel is the status label of WorkCompletions.
func wcLabel(s ibv.WCStatus) string {
	switch s {
	case ibv.WCSuccess:
		return "success"
	case ibv.WCWRFlushErr:
		return "wr_flush_err"
	case ibv.WCRemAccessErr:
		return "rem_access_err"
	case ibv.WCLocProtErr:
		return "loc_prot_err"
	case ibv.WCRetryExcErr:
		return "retry_exc_err"
	case ibv.WCRemInvReqErr:
		return "rem_inv_req_err"
	case ibv.WCLocLenErr:
		return "loc_len_err"
	}
	return fmt.Sprintf("status_%d", int(s))
}
