package localwire

import (
	"encoding/binary"
	"fmt"
)

// Version 3: prefix lookups. A LOOKUP, LOOKUP_PIN or LOOKUP_CLUSTER frame
// carries one item, a chain (one namespace, up to MaxBatch hashes); ADOPT
// and UNPIN one item each, a pin token. Each is answered with one result.

// MaxToken is the longest pin token.
const MaxToken = 64

// Chain is a LOOKUP, LOOKUP_PIN or LOOKUP_CLUSTER item: the hashes of a
// prefix chain of one namespace, in chain order.
type Chain struct {
	Namespace string
	Hashes    [][]byte
}

// LeasePlace is one read lease ADOPT hands over: its id on the adopting
// connection and where the block's slots lie.
type LeasePlace struct {
	Lease uint64
	Slots []SlotPlace
}

// ClusterHit answers LOOKUP_CLUSTER: Local blocks of the chain are on this
// node; the index says node PeerID at PeerAddr holds the first N (N 0: no
// other node holds the chain's first block; PeerAddr is then empty).
type ClusterHit struct {
	Local    uint32
	N        uint32
	PeerID   string
	PeerAddr string
}

// MaxPeerName bounds a LOOKUP_CLUSTER result's node id and address.
const MaxPeerName = 1024

// AppendChain appends a LOOKUP, LOOKUP_PIN or LOOKUP_CLUSTER item.
func AppendChain(b []byte, c Chain) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Namespace)))
	b = append(b, c.Namespace...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Hashes)))
	for _, h := range c.Hashes {
		b = append(b, byte(len(h)))
		b = append(b, h...)
	}
	return b
}

// DecodeChain decodes the single item of a LOOKUP, LOOKUP_PIN or
// LOOKUP_CLUSTER body (count must be 1). The hashes alias body.
func DecodeChain(body []byte, count int) (Chain, error) {
	var c Chain
	err := DecodeChainInto(&c, body, count)
	return c, err
}

// DecodeChainInto is DecodeChain into c, reusing c's hash slice when it is
// long enough: a daemon decoding one chain after another on a connection
// then allocates nothing per request (a fresh slice of 1,000 hashes was
// 24 KB to zero, fill through write barriers and collect per LOOKUP).
// On an error c holds no hashes.
func DecodeChainInto(c *Chain, body []byte, count int) error {
	c.Hashes = c.Hashes[:0]
	if count != 1 {
		return fmt.Errorf("%w: lookup of %d chains (want 1)", ErrMalformed, count)
	}
	r := reader{b: body}
	n := int(r.u16("namespace length"))
	ns := r.bytes(n, "namespace")
	nh := int(r.u16("hash count"))
	if r.err == nil && (n > MaxNamespace || nh > MaxBatch) {
		return fmt.Errorf("%w: namespace of %d bytes or %d hashes (max %d, %d)", ErrMalformed, n, nh, MaxNamespace, MaxBatch)
	}
	// Each hash takes at least its length byte: refuse a count the body
	// cannot hold before allocating for it.
	if r.err == nil && len(r.b) < nh {
		r.fail("hashes")
	}
	if r.err != nil {
		return r.err
	}
	if c.Namespace != string(ns) { // the comparison allocates nothing
		c.Namespace = string(ns)
	}
	hs := c.Hashes
	if cap(hs) < nh {
		hs = make([][]byte, nh)
	}
	hs = hs[:nh]
	// One bounds check per hash over the body itself (not the reader's
	// per-field checks): this loop runs for every hash of every LOOKUP.
	p := r.b
	for i := range hs {
		if len(p) < 1 || len(p)-1 < int(p[0]) {
			return fmt.Errorf("%w: truncated hash", ErrMalformed)
		}
		l := int(p[0])
		if l > MaxHash {
			return fmt.Errorf("%w: hash of %d bytes (max %d)", ErrMalformed, l, MaxHash)
		}
		hs[i], p = p[1:1+l:1+l], p[1+l:]
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(p))
	}
	c.Hashes = hs
	return nil
}

// AppendToken appends an ADOPT or UNPIN item.
func AppendToken(b []byte, tok []byte) []byte {
	b = append(b, byte(len(tok)))
	return append(b, tok...)
}

// DecodeToken decodes the single item of an ADOPT or UNPIN body.
func DecodeToken(body []byte, count int) ([]byte, error) {
	if count != 1 {
		return nil, fmt.Errorf("%w: %d tokens (want 1)", ErrMalformed, count)
	}
	r := reader{b: body}
	tok := r.bytes(int(r.u8("token length")), "token")
	if r.err == nil && len(tok) > MaxToken {
		return nil, fmt.Errorf("%w: token of %d bytes (max %d)", ErrMalformed, len(tok), MaxToken)
	}
	return tok, r.done()
}

// AdoptResultLen is the encoded size of the part of an ADOPT result that
// one block of n slots takes (the daemon pins no more than fits a frame).
func AdoptResultLen(n int) int { return 8 + 2 + 32*n }

// AdoptHeaderLen is the size of an ADOPT result before its blocks.
const AdoptHeaderLen = 1 + 4

func appendSlots(b []byte, slots []SlotPlace) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(slots)))
	for _, s := range slots {
		for _, v := range [4]uint64{s.K.Off, s.K.Len, s.V.Off, s.V.Len} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	return b
}

// slots reads a lease's slot places (1..MaxSlots of them).
func (r *reader) slots() []SlotPlace {
	n := int(r.u16("slot count"))
	if r.err == nil && (n == 0 || n > MaxSlots || len(r.b) < 32*n) {
		r.err = fmt.Errorf("%w: lease of %d slots", ErrMalformed, n)
	}
	if r.err != nil {
		return nil
	}
	out := make([]SlotPlace, n)
	for j := range out {
		out[j] = SlotPlace{
			K: Segment{r.u64("K offset"), r.u64("K length")},
			V: Segment{r.u64("V offset"), r.u64("V length")},
		}
	}
	return out
}

func appendString16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func (r *reader) string16(what string) string {
	n := int(r.u16(what + " length"))
	if r.err == nil && n > MaxPeerName {
		r.err = fmt.Errorf("%w: %s of %d bytes", ErrMalformed, what, n)
	}
	return string(r.bytes(n, what))
}

// appendLookupResult encodes the ok part of a version-3 op's result.
func appendLookupResult(b []byte, op Op, res *Result) []byte {
	switch op {
	case OpLookup:
		b = binary.LittleEndian.AppendUint32(b, res.N)
	case OpLookupPin:
		b = binary.LittleEndian.AppendUint32(b, res.N)
		b = AppendToken(b, res.Token)
	case OpAdopt:
		b = binary.LittleEndian.AppendUint32(b, uint32(len(res.Adopted)))
		for _, l := range res.Adopted {
			b = binary.LittleEndian.AppendUint64(b, l.Lease)
			b = appendSlots(b, l.Slots)
		}
	case OpLookupCluster:
		c := res.Cluster
		b = binary.LittleEndian.AppendUint32(b, c.Local)
		b = binary.LittleEndian.AppendUint32(b, c.N)
		b = appendString16(b, c.PeerID)
		b = appendString16(b, c.PeerAddr)
	}
	return b
}

// lookupResult decodes the ok part of a version-3 op's result.
func (r *reader) lookupResult(op Op, res *Result) {
	switch op {
	case OpLookup:
		res.N = r.u32("n")
	case OpLookupPin:
		res.N = r.u32("n")
		res.Token = r.bytes(int(r.u8("token length")), "token")
		if r.err == nil && len(res.Token) > MaxToken {
			r.err = fmt.Errorf("%w: token of %d bytes", ErrMalformed, len(res.Token))
		}
	case OpAdopt:
		n := int(r.u32("lease count"))
		// Each lease takes at least 10 bytes: refuse a count the body
		// cannot hold before allocating for it.
		if r.err == nil && (n > MaxBatch || len(r.b) < 10*n) {
			r.err = fmt.Errorf("%w: adopt of %d leases", ErrMalformed, n)
		}
		if r.err != nil {
			return
		}
		res.Adopted = make([]LeasePlace, n)
		for i := range res.Adopted {
			res.Adopted[i] = LeasePlace{Lease: r.u64("lease"), Slots: r.slots()}
		}
	case OpLookupCluster:
		res.Cluster = ClusterHit{Local: r.u32("local"), N: r.u32("n")}
		res.Cluster.PeerID = r.string16("peer id")
		res.Cluster.PeerAddr = r.string16("peer address")
	case OpUnpin:
	}
}
