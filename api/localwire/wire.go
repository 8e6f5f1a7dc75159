// Package localwire is the wire format of pegad's local data socket
// (docs/local-protocol.md): length-prefixed binary frames on a unix stream
// socket, over which a local client receives the pool's memfd and takes
// write and read leases on ranges of it.
//
// It only encodes and decodes bytes. It must never hold state, touch a
// socket or the pool; the daemon (internal/localdata) and the public client
// (client/) both build on it, so the two cannot drift apart. Every decoder
// takes untrusted bytes and returns ErrMalformed rather than panicking.
package localwire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pegaflow/pegad/api/limits"
)

// Version is the newest protocol version, the one a HELLO from this
// package's users carries. Version 2 adds RESERVE and PUT (a Put in one
// round trip); version 3 the prefix lookups (LOOKUP, LOOKUP_PIN, ADOPT,
// UNPIN, LOOKUP_CLUSTER); version 4 NUMA placement (the pool's parts in
// the HELLO reply, ALLOC_ON). A daemon answers HELLO with the version the
// client asked for, from MinVersion up to Version.
const Version = 4

// MinVersion is the oldest version a daemon still speaks.
const MinVersion = 1

// Limits every frame obeys. A peer that breaks one is closed.
const (
	HeaderLen    = 12                         // u32 length, u8 op, u8 status, u16 count, u32 seq
	MaxFrame     = 16 << 20                   // most bytes after the length field
	MaxBatch     = limits.MaxBlocksPerRequest // most items in one frame
	MaxNamespace = limits.MaxNamespaceLen
	MaxHash      = limits.MaxHashLen
	MaxSlots     = 1024
	MaxMessage   = 1024 // longest error message in a result
)

// ErrMalformed: bytes that are not a valid frame or body.
var ErrMalformed = errors.New("localwire: malformed frame")

// Op is a request kind; the response to a request carries the same op.
type Op uint8

const (
	OpHello   Op = 1 // version → pool size, lease timeout, and the memfd (SCM_RIGHTS)
	OpAlloc   Op = 2 // (namespace, hash, slot sizes)… → write leases
	OpCommit  Op = 3 // write lease ids… → block indexed
	OpAbort   Op = 4 // write lease ids… → space returned
	OpLease   Op = 5 // (namespace, hash)… → read leases (pins)
	OpRelease Op = 6 // read lease ids… → unpinned
	OpRenew   Op = 7 // lease ids (either kind)… → deadline pushed back
	OpReserve Op = 8 // sizes… → reservations: write leases on room not yet named (version 2)
	OpPut     Op = 9 // (reservation, namespace, hash, slot sizes, next size)… → block indexed, next reservation (version 2)

	OpLookup        Op = 10 // one chain → n present from its start; nothing pinned or touched (version 3)
	OpLookupPin     Op = 11 // one chain → n and a token naming a pin of those n blocks (version 3)
	OpAdopt         Op = 12 // one token → its pin's blocks as read leases of this connection (version 3)
	OpUnpin         Op = 13 // one token → its pin dropped (version 3)
	OpLookupCluster Op = 14 // one chain → n local, and the node the cluster index says holds the longest prefix (version 3)

	OpAllocOn Op = 15 // (node, namespace, hash, slot sizes)… → write leases, as ALLOC, on the node's part of the pool where it has room (version 4)
)

// MinVersionOf is the protocol version that brought op.
func MinVersionOf(op Op) uint32 {
	switch {
	case op >= OpAllocOn:
		return 4
	case op >= OpLookup:
		return 3
	case op >= OpReserve:
		return 2
	}
	return 1
}

func (o Op) String() string {
	switch o {
	case OpHello:
		return "hello"
	case OpAlloc:
		return "alloc"
	case OpCommit:
		return "commit"
	case OpAbort:
		return "abort"
	case OpLease:
		return "lease"
	case OpRelease:
		return "release"
	case OpRenew:
		return "renew"
	case OpReserve:
		return "reserve"
	case OpPut:
		return "put"
	case OpLookup:
		return "lookup"
	case OpLookupPin:
		return "lookup_pin"
	case OpAdopt:
		return "adopt"
	case OpUnpin:
		return "unpin"
	case OpLookupCluster:
		return "lookup_cluster"
	case OpAllocOn:
		return "alloc_on"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Status is the outcome of one item (or, in a response header, of the whole
// frame: non-zero there means the request was refused as a whole, the body
// is a message, and the daemon closes the connection).
type Status uint8

const (
	StatusOK       Status = 0
	StatusNotFound Status = 1 // no such block
	StatusPoolFull Status = 2 // no room even after evicting every unpinned block
	StatusInvalid  Status = 3 // bad key, sizes or request
	StatusExists   Status = 4 // alloc of a key already indexed: nothing to write
	StatusNoLease  Status = 5 // lease id unknown on this connection (ended, expired, never given)
	StatusLimit    Status = 6 // per-connection lease limit or response size reached
	StatusInternal Status = 7
	StatusClosed   Status = 8 // daemon shutting down
	StatusDenied   Status = 9 // the pin token belongs to another user (version 3)
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNotFound:
		return "not found"
	case StatusPoolFull:
		return "pool full"
	case StatusInvalid:
		return "invalid"
	case StatusExists:
		return "exists"
	case StatusNoLease:
		return "no such lease"
	case StatusLimit:
		return "limit reached"
	case StatusInternal:
		return "internal error"
	case StatusClosed:
		return "closed"
	case StatusDenied:
		return "denied"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Header starts every frame. Len counts the bytes after the length field
// (HeaderLen-4 + body).
type Header struct {
	Len    uint32
	Op     Op
	Status Status
	Count  uint16
	Seq    uint32
}

// BodyLen is the length of the body that follows the header.
func (h Header) BodyLen() int { return int(h.Len) - (HeaderLen - 4) }

// ParseHeader decodes the first HeaderLen bytes of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: header of %d bytes", ErrMalformed, len(b))
	}
	h := Header{
		Len:    binary.LittleEndian.Uint32(b[0:]),
		Op:     Op(b[4]),
		Status: Status(b[5]),
		Count:  binary.LittleEndian.Uint16(b[6:]),
		Seq:    binary.LittleEndian.Uint32(b[8:]),
	}
	if h.Len < HeaderLen-4 || h.Len > MaxFrame {
		return Header{}, fmt.Errorf("%w: frame length %d (want %d..%d)", ErrMalformed, h.Len, HeaderLen-4, MaxFrame)
	}
	if h.Count > MaxBatch {
		return Header{}, fmt.Errorf("%w: %d items (max %d)", ErrMalformed, h.Count, MaxBatch)
	}
	return h, nil
}

// Begin starts a frame in b (reset to length 0) with a header whose length
// Finish fills in.
func Begin(b []byte, op Op, st Status, count int, seq uint32) []byte {
	b = b[:0]
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, byte(op), byte(st))
	b = binary.LittleEndian.AppendUint16(b, uint16(count))
	return binary.LittleEndian.AppendUint32(b, seq)
}

// Finish writes the frame's length; ErrMalformed when it exceeds MaxFrame.
func Finish(b []byte) ([]byte, error) {
	if len(b) < HeaderLen || len(b)-4 > MaxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes (max %d)", ErrMalformed, len(b)-4, MaxFrame)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
	return b, nil
}

// SlotSize is the shape of one slot of a block: a K segment and an
// optional V segment (V 0: none).
type SlotSize struct{ K, V uint64 }

// Segment is a range of the pool: [Off, Off+Len).
type Segment struct{ Off, Len uint64 }

// SlotPlace is where a leased block's slot lives (V.Len 0: no V segment).
type SlotPlace struct{ K, V Segment }

// Key names a block.
type Key struct {
	Namespace string
	Hash      []byte
}

// AllocItem asks for room for one block. Its bytes go contiguously, in
// slot order: slot 0 K, slot 0 V, slot 1 K, ...
type AllocItem struct {
	Key
	Slots []SlotSize
}

// PutItem commits the reservation ID as the block Key, laid out as Slots
// (their sizes add up to the reservation's length), and asks for a new
// reservation of Next bytes (0: none) in the same round trip.
type PutItem struct {
	ID uint64
	Key
	Slots []SlotSize
	Next  uint64
}

// Hello is the client's first frame body; HelloReply the daemon's answer,
// sent with the memfd as SCM_RIGHTS ancillary data.
type Hello struct{ Version uint32 }

type HelloReply struct {
	Version      uint32
	PoolSize     uint64
	LeaseTimeout uint64 // milliseconds a lease lives without Renew
	// Parts are the pool's NUMA parts, in address order, tiling
	// [0, PoolSize) (version 4; nil before).
	Parts []Part
}

// Result is one item of a response. Which fields are set depends on the op:
// Alloc, AllocOn and Reserve: Lease, Seg; Commit: Created; Lease: Lease, Slots;
// Put: Created, Next, and Lease, Seg of the next reservation when Next is
// OK (Lease 0: none asked for); Lookup: N; LookupPin: N, Token; Adopt:
// Adopted; LookupCluster: Cluster; others: none. Msg is set when Status
// is not OK.
type Result struct {
	Status  Status
	Msg     string
	Lease   uint64
	Seg     Segment
	Created bool
	Slots   []SlotPlace
	Next    Status
	N       uint32
	Token   []byte
	Adopted []LeasePlace
	Cluster ClusterHit
}
