package localwire

import (
	"encoding/binary"
	"fmt"
)

// reader is a cursor over untrusted bytes; the first short read makes err
// sticky and every later read returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated %s", ErrMalformed, what)
	}
}

func (r *reader) u8(what string) uint8 {
	if r.err != nil || len(r.b) < 1 {
		r.fail(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16(what string) uint16 {
	if r.err != nil || len(r.b) < 2 {
		r.fail(what)
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) u32(what string) uint32 {
	if r.err != nil || len(r.b) < 4 {
		r.fail(what)
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64(what string) uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail(what)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes(n int, what string) []byte {
	if r.err != nil || len(r.b) < n {
		r.fail(what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// done checks that the body was consumed exactly.
func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(r.b))
	}
	return nil
}

func appendKey(b []byte, k Key) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(k.Namespace)))
	b = append(b, k.Namespace...)
	b = append(b, byte(len(k.Hash)))
	return append(b, k.Hash...)
}

func (r *reader) key() Key {
	n := int(r.u16("namespace length"))
	ns := r.bytes(n, "namespace")
	h := r.bytes(int(r.u8("hash length")), "hash")
	if r.err == nil && (n > MaxNamespace || len(h) > MaxHash) {
		r.err = fmt.Errorf("%w: namespace of %d or hash of %d bytes (max %d, %d)", ErrMalformed, n, len(h), MaxNamespace, MaxHash)
	}
	return Key{Namespace: string(ns), Hash: h}
}

// --- requests ---

// AppendHello appends a HELLO body.
func AppendHello(b []byte, h Hello) []byte { return binary.LittleEndian.AppendUint32(b, h.Version) }

// DecodeHello decodes a HELLO body.
func DecodeHello(body []byte) (Hello, error) {
	r := reader{b: body}
	h := Hello{Version: r.u32("version")}
	return h, r.done()
}

// AppendHelloReply appends a HELLO response body.
func AppendHelloReply(b []byte, h HelloReply) []byte {
	b = binary.LittleEndian.AppendUint32(b, h.Version)
	b = binary.LittleEndian.AppendUint64(b, h.PoolSize)
	b = binary.LittleEndian.AppendUint64(b, h.LeaseTimeout)
	if h.Version >= 4 {
		b = appendParts(b, h.Parts)
	}
	return b
}

// DecodeHelloReply decodes a HELLO response body.
func DecodeHelloReply(body []byte) (HelloReply, error) {
	r := reader{b: body}
	h := HelloReply{Version: r.u32("version"), PoolSize: r.u64("pool size"), LeaseTimeout: r.u64("lease timeout")}
	if r.err == nil && h.Version >= 4 {
		h.Parts = r.parts(h.PoolSize)
	}
	return h, r.done()
}

// AppendAllocItem appends one ALLOC request item.
func AppendAllocItem(b []byte, it AllocItem) []byte {
	b = appendKey(b, it.Key)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(it.Slots)))
	for _, s := range it.Slots {
		b = binary.LittleEndian.AppendUint64(b, s.K)
		b = binary.LittleEndian.AppendUint64(b, s.V)
	}
	return b
}

// DecodeAllocItems decodes the count items of an ALLOC body. Sizes are not
// checked beyond the slot count: that is the daemon's business.
func DecodeAllocItems(body []byte, count int) ([]AllocItem, error) {
	r := reader{b: body}
	out := make([]AllocItem, 0, min(count, MaxBatch))
	for range count {
		it, err := r.allocItem()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	return out, r.done()
}

// allocItem reads one key and its slot sizes, the part an ALLOC item and
// a PUT item share; a slot count over MaxSlots or beyond the body is
// refused before anything is allocated for it.
func (r *reader) allocItem() (AllocItem, error) {
	it := AllocItem{Key: r.key()}
	n := int(r.u16("slot count"))
	if r.err == nil && n > MaxSlots {
		return AllocItem{}, fmt.Errorf("%w: %d slots (max %d)", ErrMalformed, n, MaxSlots)
	}
	if r.err == nil && len(r.b) < 16*n {
		r.fail("slots")
	}
	if r.err != nil {
		return AllocItem{}, r.err
	}
	it.Slots = make([]SlotSize, n)
	for i := range it.Slots {
		it.Slots[i] = SlotSize{K: r.u64("K size"), V: r.u64("V size")}
	}
	return it, nil
}

// AppendPutItem appends one PUT request item.
func AppendPutItem(b []byte, it PutItem) []byte {
	b = binary.LittleEndian.AppendUint64(b, it.ID)
	b = AppendAllocItem(b, AllocItem{Key: it.Key, Slots: it.Slots})
	return binary.LittleEndian.AppendUint64(b, it.Next)
}

// DecodePutItems decodes the count items of a PUT body; as with ALLOC,
// sizes are the daemon's to check.
func DecodePutItems(body []byte, count int) ([]PutItem, error) {
	r := reader{b: body}
	out := make([]PutItem, 0, min(count, MaxBatch))
	for range count {
		id := r.u64("reservation id")
		a, err := r.allocItem()
		if err != nil {
			return nil, err
		}
		out = append(out, PutItem{ID: id, Key: a.Key, Slots: a.Slots, Next: r.u64("next size")})
	}
	return out, r.done()
}

// AppendKeyItem appends one LEASE request item.
func AppendKeyItem(b []byte, k Key) []byte { return appendKey(b, k) }

// DecodeKeys decodes the count items of a LEASE body.
func DecodeKeys(body []byte, count int) ([]Key, error) {
	r := reader{b: body}
	out := make([]Key, 0, min(count, MaxBatch))
	for range count {
		k := r.key()
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, k)
	}
	return out, r.done()
}

// AppendID appends one lease id (COMMIT, ABORT, RELEASE, RENEW items) or
// one size (RESERVE items: the same u64).
func AppendID(b []byte, id uint64) []byte { return binary.LittleEndian.AppendUint64(b, id) }

// DecodeIDs decodes the count lease ids of a COMMIT, ABORT, RELEASE or
// RENEW body, or the count sizes of a RESERVE body.
func DecodeIDs(body []byte, count int) ([]uint64, error) {
	if len(body) != 8*count {
		return nil, fmt.Errorf("%w: %d bytes for %d lease ids", ErrMalformed, len(body), count)
	}
	r := reader{b: body}
	out := make([]uint64, count)
	for i := range out {
		out[i] = r.u64("lease id")
	}
	return out, r.done()
}

// --- responses ---

// AppendError appends a failed result of any op.
func AppendError(b []byte, st Status, msg string) []byte {
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	b = append(b, byte(st))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// AppendResult appends one successful result of op (Status must be OK).
func AppendResult(b []byte, op Op, res *Result) []byte {
	b = append(b, byte(StatusOK))
	switch op {
	case OpAlloc, OpAllocOn, OpReserve:
		b = binary.LittleEndian.AppendUint64(b, res.Lease)
		b = binary.LittleEndian.AppendUint64(b, res.Seg.Off)
		b = binary.LittleEndian.AppendUint64(b, res.Seg.Len)
	case OpCommit:
		b = appendCreated(b, res.Created)
	case OpPut:
		b = appendCreated(b, res.Created)
		b = append(b, byte(res.Next))
		var l, off, n uint64
		if res.Next == StatusOK {
			l, off, n = res.Lease, res.Seg.Off, res.Seg.Len
		}
		b = binary.LittleEndian.AppendUint64(b, l)
		b = binary.LittleEndian.AppendUint64(b, off)
		b = binary.LittleEndian.AppendUint64(b, n)
	case OpLease:
		b = binary.LittleEndian.AppendUint64(b, res.Lease)
		b = appendSlots(b, res.Slots)
	case OpLookup, OpLookupPin, OpAdopt, OpLookupCluster:
		b = appendLookupResult(b, op, res)
	}
	return b
}

func appendCreated(b []byte, created bool) []byte {
	if created {
		return append(b, 1)
	}
	return append(b, 0)
}

// LeaseResultLen is the encoded size of a successful LEASE result of a
// block with n slots (the daemon keeps a response under MaxFrame with it).
func LeaseResultLen(n int) int { return 1 + 8 + 2 + 32*n }

// DecodeResults decodes the count results of an op's response body.
func DecodeResults(op Op, body []byte, count int) ([]Result, error) {
	r := reader{b: body}
	out := make([]Result, count)
	for i := range out {
		res := &out[i]
		res.Status = Status(r.u8("status"))
		if r.err != nil {
			return nil, r.err
		}
		if res.Status != StatusOK {
			n := int(r.u16("message length"))
			if r.err == nil && n > MaxMessage {
				return nil, fmt.Errorf("%w: message of %d bytes", ErrMalformed, n)
			}
			res.Msg = string(r.bytes(n, "message"))
			continue
		}
		switch op {
		case OpAlloc, OpAllocOn, OpReserve:
			res.Lease, res.Seg.Off, res.Seg.Len = r.u64("lease"), r.u64("offset"), r.u64("length")
		case OpCommit:
			res.Created = r.created()
		case OpPut:
			res.Created = r.created()
			res.Next = Status(r.u8("next status"))
			res.Lease, res.Seg.Off, res.Seg.Len = r.u64("next lease"), r.u64("next offset"), r.u64("next length")
			if r.err == nil && res.Next != StatusOK && (res.Lease != 0 || res.Seg != Segment{}) {
				return nil, fmt.Errorf("%w: put result with next status %v and a next lease", ErrMalformed, res.Next)
			}
		case OpLease:
			res.Lease = r.u64("lease")
			res.Slots = r.slots()
		case OpLookup, OpLookupPin, OpAdopt, OpLookupCluster, OpUnpin:
			r.lookupResult(op, res)
		case OpAbort, OpRelease, OpRenew:
		default:
			return nil, fmt.Errorf("%w: results of %v", ErrMalformed, op)
		}
		if r.err != nil {
			return nil, r.err
		}
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return out, nil
}

// created reads a COMMIT or PUT result's created flag (0 or 1).
func (r *reader) created() bool {
	switch r.u8("created") {
	case 0:
	case 1:
		return true
	default:
		if r.err == nil {
			r.err = fmt.Errorf("%w: created flag not 0 or 1", ErrMalformed)
		}
	}
	return false
}
