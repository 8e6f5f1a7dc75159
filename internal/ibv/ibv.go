// Package ibv is pegad's verbs model: devices, protection domains, memory
// regions, completion queues and reliable-connected queue pairs, with the
// semantics of libibverbs. Two providers implement it: the real one over
// libibverbs (package ibv/verbs) and a software RC provider over TCP
// (package ibv/tcp) for hosts without RDMA NICs and for tests.
//
// This package owns only the model (types, constants, errors); it must never
// hold per-connection state or know about peers, sessions or blocks.
package ibv

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors a provider returns; callers branch on them with errors.Is.
var (
	// ErrUnavailable: the provider cannot run on this host (no library, no
	// device, no kernel support). Wrapped with the reason.
	ErrUnavailable = errors.New("ibv: provider unavailable")
	// ErrNoDevice: the named device does not exist.
	ErrNoDevice = errors.New("ibv: no such device")
	// ErrInvalidState: the operation is not allowed in the QP's state (e.g.
	// posting to a QP that is not RTS, connecting twice).
	ErrInvalidState = errors.New("ibv: invalid queue pair state")
	// ErrQueueFull: posting would exceed the send queue depth (ENOMEM in
	// ibv_post_send). Nothing of the chain from the failing WR on is posted.
	ErrQueueFull = errors.New("ibv: send queue full")
	// ErrInvalidArgument: a malformed request (zero length, bad opcode,
	// memory not suitable for registration, ...).
	ErrInvalidArgument = errors.New("ibv: invalid argument")
	// ErrClosed: the object was destroyed.
	ErrClosed = errors.New("ibv: object closed")
	// ErrPeerClosed: the remote end closed or reset the transport
	// connection under outstanding work. A software provider attaches it
	// (wrapped with what it saw) as a failed completion's Cause; the status
	// stays what a real HCA reports when the peer vanishes (RETRY_EXC_ERR).
	ErrPeerClosed = errors.New("peer closed the connection")
)

// WCStatus is a work completion status, numbered as enum ibv_wc_status.
type WCStatus int

const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRDReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error",
	"local EE context operation error", "local protection error",
	"Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request",
	"aborted error", "invalid EE context number", "invalid EE context state",
	"fatal error", "response timeout error", "general error",
	"TM error", "TM rendezvous incomplete",
}

// String matches ibv_wc_status_str.
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("unknown(%d)", int(s))
}

// Opcode is a send work request opcode, numbered as enum ibv_wr_opcode.
type Opcode int

const (
	OpRDMAWrite Opcode = 0
	OpRDMARead  Opcode = 4
	// Memory-window WRs (enum ibv_wr_opcode), posted through MWQP only.
	OpLocalInv Opcode = 7
	OpBindMW   Opcode = 8
)

func (o Opcode) String() string {
	switch o {
	case OpRDMAWrite:
		return "RDMA_WRITE"
	case OpRDMARead:
		return "RDMA_READ"
	case OpBindMW:
		return "BIND_MW"
	case OpLocalInv:
		return "LOCAL_INV"
	}
	return fmt.Sprintf("opcode(%d)", int(o))
}

// Access flags of a memory region, as enum ibv_access_flags.
type Access uint32

const (
	AccessLocalWrite  Access = 1
	AccessRemoteWrite Access = 2
	AccessRemoteRead  Access = 4
	// AccessMWBind lets memory windows be bound over the region
	// (IBV_ACCESS_MW_BIND, ibv_reg_mr(3)).
	AccessMWBind Access = 16
	// AccessRelaxedOrdering lets the NIC write READ responses to memory
	// out of order (faster on AMD, Grace and PCIe-switch hosts; a
	// completion still means all data is visible: ibv_reg_mr(3)). An
	// optional flag: dropped where the kernel or NIC lacks support.
	AccessRelaxedOrdering Access = 1 << 20
)

// QPState is a queue pair state, numbered as enum ibv_qp_state.
type QPState int

const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSError QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPSReset:
		return "RESET"
	case QPSInit:
		return "INIT"
	case QPSRTR:
		return "RTR"
	case QPSRTS:
		return "RTS"
	case QPSSQD:
		return "SQD"
	case QPSSQE:
		return "SQE"
	case QPSError:
		return "ERROR"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// GID is a 128-bit port global identifier.
type GID [16]byte

// DeviceInfo describes one device (HCA) and the port pegad uses on it.
type DeviceInfo struct {
	Name      string
	NUMANode  int    // -1 when unknown
	Port      uint8  // the active port chosen
	LinkLayer string // "InfiniBand", "Ethernet" or "tcp"
	GID       GID
	GIDIndex  int
	LID       uint16
	MTU       int // active MTU in bytes
	// Limits the provider enforces.
	MaxQPWR     int // send queue depth limit
	MaxRdAtomic int // max outstanding RDMA READs per QP
	// MemWindows: the device binds type-2 memory windows
	// (IBV_DEVICE_MEM_WINDOW_TYPE_2B and max_mw > 0, ibv_query_device(3)).
	MemWindows bool
	// Addr is the data listener of a tcp device (host:port); empty for verbs.
	Addr string
}

// Endpoint is what two sides of an RC connection exchange in a handshake.
type Endpoint struct {
	GID  GID
	LID  uint16
	QPN  uint32
	PSN  uint32 // 24 bits
	MTU  int
	Addr string // tcp provider: the remote device's data listener
	// MaxDestRd is the QP's responder resources (max_dest_rd_atomic): the
	// peer's initiator depth (max_rd_atomic) must not exceed it. 0: unknown.
	MaxDestRd uint8
	// Secret (tcp provider) is what a data connection to this QP must
	// present in its hello: random per QP, so per handshake, and known
	// only to the two sides of the handshake. Zero for verbs.
	Secret [16]byte
}

// RemoteRegion is one registered region of a peer's memory, as snapshotted
// in a handshake: READs may target [Base, Base+Length) with RKey.
type RemoteRegion struct {
	Base   uint64
	Length uint64
	RKey   uint32
}

// Contains reports whether [addr, addr+n) lies inside the region.
func (r RemoteRegion) Contains(addr, n uint64) bool {
	return addr >= r.Base && n <= r.Length && addr-r.Base <= r.Length-n
}

// QPCap sizes a queue pair.
type QPCap struct {
	MaxSendWR   int // send queue depth
	MaxRecvWR   int
	MaxSendSGE  int
	MaxRdAtomic int // outstanding READs this QP initiates (max_rd_atomic)
}

// ConnectAttr are the RC attributes used when moving INIT→RTR→RTS.
type ConnectAttr struct {
	MTU         int   // path MTU in bytes; 0: min(local, remote)
	Timeout     uint8 // local ACK timeout exponent: 4.096us * 2^Timeout
	RetryCnt    uint8
	RNRRetry    uint8
	MinRNRTimer uint8
	MaxRdAtomic uint8 // max_rd_atomic (initiator)
	MaxDestRd   uint8 // max_dest_rd_atomic (responder)
	SL          uint8
	TrafficCls  uint8
	HopLimit    uint8
}

// DefaultConnectAttr are the attributes used by Mooncake and pegaflow alike.
func DefaultConnectAttr() ConnectAttr {
	return ConnectAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		MaxRdAtomic: 16, MaxDestRd: 16, HopLimit: 64}
}

// RetryBudget is how long a requester waits for an ACK before
// RETRY_EXC_ERR: 4.096us * 2^Timeout per try, RetryCnt+1 tries.
func (a ConnectAttr) RetryBudget() time.Duration {
	per := time.Duration(4096*(uint64(1)<<a.Timeout)) * time.Nanosecond
	return per * time.Duration(int(a.RetryCnt)+1)
}

// SendWR is one send work request with a single scatter/gather entry.
type SendWR struct {
	ID         uint64
	Op         Opcode
	Signaled   bool
	LocalAddr  uint64 // inside a local MR
	Length     uint32
	LKey       uint32
	RemoteAddr uint64
	RKey       uint32
}

// WorkCompletion is one entry polled from a CQ.
type WorkCompletion struct {
	ID        uint64
	Status    WCStatus
	Op        Opcode
	Bytes     uint32
	QPN       uint32
	VendorErr uint32
	// Cause, for a failed completion of a software provider, is what it
	// saw (ErrPeerClosed wrapping the socket error, a dial error); nil from
	// a real HCA, which says no more than the status.
	Cause error
}

// Provider enumerates and opens devices of one kind.
type Provider interface {
	// Name is "verbs" or "tcp".
	Name() string
	// Devices lists usable devices. ErrUnavailable (wrapped with the reason)
	// when the provider cannot run on this host.
	Devices() ([]DeviceInfo, error)
	// Open opens a device by name.
	Open(name string) (Device, error)
}

// DeviceEventKind is what an asynchronous device event says about the
// port a device is used through.
type DeviceEventKind int

const (
	// PortDown: the port left ACTIVE (IBV_EVENT_PORT_ERR); connections
	// through it are dead.
	PortDown DeviceEventKind = iota + 1
	// PortUp: the port is ACTIVE again (IBV_EVENT_PORT_ACTIVE).
	PortUp
	// AddressChange: the port's GID or LID changed (an IP removed and
	// re-added, a bond failover, a new LID from the subnet manager); the
	// device re-resolved it, and QPs created from now on use the new one.
	AddressChange
	// DeviceFatal: the device is unusable (IBV_EVENT_DEVICE_FATAL: a
	// firmware or driver reset, a PCIe error). Every object of its context
	// is dead; it must be closed, and opened again once it is back.
	DeviceFatal
)

func (k DeviceEventKind) String() string {
	switch k {
	case PortDown:
		return "port_down"
	case PortUp:
		return "port_up"
	case AddressChange:
		return "address_change"
	case DeviceFatal:
		return "device_fatal"
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// DeviceEvent is one asynchronous event of a device's port.
type DeviceEvent struct {
	Kind DeviceEventKind
	Info DeviceInfo // the device as resolved after the event
}

// PortStater is a Device whose port state can be queried now
// (ibv_query_port(3)): a READ that fails before the port's event arrives
// (rxe fails it at once when its netdev goes down) is told apart from a
// failure of the path or the peer by the port it went through.
type PortStater interface {
	PortActive() (bool, error)
}

// EventDevice is a Device that reports asynchronous port events. Events
// is closed when the device is closed; a slow reader misses events, never
// blocks the device.
type EventDevice interface {
	Device
	Events() <-chan DeviceEvent
}

// Device is an open device context.
type Device interface {
	Info() DeviceInfo
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with at least depth entries.
	CreateCQ(depth int) (CQ, error)
	Close() error
}

// PD is a protection domain: MRs and QPs of one PD work together only.
type PD interface {
	// RegMR registers memory that the Go garbage collector does not own
	// (mmap'd pool memory). The region stays registered until Dereg.
	RegMR(buf []byte, access Access) (MR, error)
	// CreateQP creates an RC queue pair on cq, already moved to INIT with
	// remote read/write access enabled.
	CreateQP(cq CQ, cap QPCap) (QP, error)
	Close() error
}

// MW is a type-2 memory window (ibv_alloc_mw(3)): an rkey over a range of
// an MR, usable only by the QP it was bound on, until invalidated.
type MW interface {
	// RKey is the window's rkey as last bound (ibv_inc_rkey'd per bind).
	RKey() uint32
	Dealloc() error
}

// MWPD is a PD whose device binds type-2 memory windows.
type MWPD interface {
	AllocMW() (MW, error)
}

// MWQP is a QP that binds and invalidates type-2 memory windows through its
// send queue (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV; ibv_post_send(3)). Both
// complete on the QP's send CQ like any WR; a failed one moves the QP to
// ERROR.
type MWQP interface {
	// PostBindMW binds mw over [addr, addr+length) of mr (registered with
	// AccessMWBind) with access, and returns the rkey the window gets: a
	// peer READ with it works through this QP's peer only.
	PostBindMW(mw MW, mr MR, addr, length uint64, access Access, id uint64, signaled bool) (uint32, error)
	// PostLocalInv invalidates the window with rkey: later READs with it
	// fail with a remote access error.
	PostLocalInv(rkey uint32, id uint64, signaled bool) error
}

// MR is a registered memory region.
type MR interface {
	Addr() uint64
	Len() uint64
	LKey() uint32
	RKey() uint32
	Dereg() error
}

// QP is a reliable-connected queue pair.
type QP interface {
	QPN() uint32
	State() QPState
	// Endpoint is what the peer needs to connect to this QP.
	Endpoint() Endpoint
	// Connect moves INIT→RTR→RTS toward remote.
	Connect(remote Endpoint, attr ConnectAttr) error
	// PostSend posts a chain of work requests in order. On error, the WRs
	// from the failing one on are not posted; the index of that WR is
	// returned as bad (-1 when the error is not tied to one WR).
	PostSend(wrs []SendWR) (bad int, err error)
	// ToError moves the QP to ERROR: outstanding and later WRs complete
	// with WR_FLUSH_ERR.
	ToError() error
	// Destroy releases the QP; safe with outstanding WRs (they are
	// flushed and never touch memory afterwards).
	Destroy() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll fills wcs with up to len(wcs) completions and returns how many.
	Poll(wcs []WorkCompletion) (int, error)
	// Wait blocks until a completion may be available, ctx is done (its
	// error is returned) or the CQ is closed (ErrClosed).
	Wait(ctx context.Context) error
	Close() error
}

// StatusError is a failed work completion turned into an error.
type StatusError struct {
	Status WCStatus
	QPN    uint32
	WRID   uint64
	// VendorErr is the completion's vendor syndrome (0: none given): what
	// a NIC vendor's support asks for first.
	VendorErr uint32
	// Cause is the completion's Cause (nil when the provider gave none).
	Cause error
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("work completion qpn=%d wr_id=%d: %s (%d)", e.QPN, e.WRID, e.Status, int(e.Status))
	if e.VendorErr != 0 {
		s += fmt.Sprintf(" vendor_err=%#x", e.VendorErr)
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap exposes Cause to errors.Is (ErrPeerClosed) and errors.As.
func (e *StatusError) Unwrap() error { return e.Cause }
