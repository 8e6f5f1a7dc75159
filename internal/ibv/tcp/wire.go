package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format of a data connection. Every frame is
//
//	u32 bodyLen | u8 type | fixed fields of the type | payload
//
// big endian, bodyLen counting everything after itself. A body is never
// longer than maxBody, so a reader needs one fixed-size buffer and never
// allocates a size chosen by the peer.

const (
	// chunkSize is the largest payload of one READ response or WRITE
	// request frame; bigger work requests are split into chunks.
	chunkSize = 1 << 20
	// maxBody bounds a frame body: the largest fixed part plus a chunk.
	maxBody = 64 + chunkSize
	// maxAddrLen bounds the address carried in a hello.
	maxAddrLen = 255
	prefixLen  = 5 // u32 bodyLen + u8 type
)

// Frame types.
const (
	tHello        byte = 1 // initiator → responder, first frame of a connection
	tHelloAck     byte = 2 // responder → initiator
	tReadReq      byte = 3
	tReadResp     byte = 4
	tWriteReq     byte = 5
	tWriteAck     byte = 6
	fixedHello         = 4 + 4 + 4 + 16 + 16 + 1 // srcQPN dstQPN srcPSN gid secret addrLen
	fixedReadReq       = 8 + 8 + 4 + 4           // seq raddr rkey len
	fixedReadResp      = 8 + 1 + 4               // seq status offset
	fixedWriteReq      = 8 + 8 + 4 + 4 + 4       // seq raddr rkey total offset
	fixedWriteAck      = 8 + 1                   // seq status
	fixedHelloAck      = 1                       // status
)

// Status codes carried in responses and hello acks.
const (
	stOK        byte = 0
	stRemAccess byte = 1 // bad rkey, out of bounds, missing access
	stRemInvReq byte = 2 // malformed request
	// hello rejections
	stNoQP     byte = 10 // no such QP on the responder device
	stBadState byte = 11 // QP not in RTR/RTS
	stMismatch byte = 12 // QP connected to another remote endpoint
	// stBadSecret: the hello's secret is not the QP's. Never sent: the ack
	// says stNoQP, so a stranger learns nothing about the QP.
	stBadSecret byte = 13
)

// errFrame is returned for any malformed frame; the connection is dropped.
var errFrame = errors.New("tcp: malformed frame")

// msg is a decoded frame. Payload aliases the read buffer.
type msg struct {
	typ     byte
	srcQPN  uint32 // hello
	dstQPN  uint32 // hello
	srcPSN  uint32 // hello
	gid     [16]byte
	secret  [16]byte // hello: the target QP's Endpoint.Secret
	addr    string   // hello
	seq     uint64
	raddr   uint64
	rkey    uint32
	length  uint32 // read request length, write total length
	offset  uint32 // chunk offset inside the work request
	status  byte
	payload []byte
}

// decode parses one frame body (type byte first). It never allocates more
// than the hello address string.
func decode(body []byte) (msg, error) {
	var m msg
	if len(body) < 1 || len(body) > maxBody {
		return m, fmt.Errorf("%w: body length %d", errFrame, len(body))
	}
	m.typ = body[0]
	b := body[1:]
	need := func(n int) error {
		if len(b) < n {
			return fmt.Errorf("%w: type %d body %d < %d", errFrame, m.typ, len(b), n)
		}
		return nil
	}
	be := binary.BigEndian
	switch m.typ {
	case tHello:
		if err := need(fixedHello); err != nil {
			return m, err
		}
		m.srcQPN, m.dstQPN, m.srcPSN = be.Uint32(b), be.Uint32(b[4:]), be.Uint32(b[8:])
		copy(m.gid[:], b[12:28])
		copy(m.secret[:], b[28:44])
		n := int(b[44])
		if len(b) != fixedHello+n {
			return m, fmt.Errorf("%w: hello address length %d", errFrame, n)
		}
		m.addr = string(b[fixedHello:])
		if m.srcQPN > qpnMask || m.dstQPN > qpnMask || m.srcPSN > qpnMask {
			return m, fmt.Errorf("%w: hello field over 24 bits", errFrame)
		}
	case tHelloAck:
		if len(b) != fixedHelloAck {
			return m, fmt.Errorf("%w: hello ack length %d", errFrame, len(b))
		}
		m.status = b[0]
	case tReadReq:
		if len(b) != fixedReadReq {
			return m, fmt.Errorf("%w: read request length %d", errFrame, len(b))
		}
		m.seq, m.raddr, m.rkey, m.length = be.Uint64(b), be.Uint64(b[8:]), be.Uint32(b[16:]), be.Uint32(b[20:])
	case tReadResp:
		if err := need(fixedReadResp); err != nil {
			return m, err
		}
		m.seq, m.status, m.offset = be.Uint64(b), b[8], be.Uint32(b[9:])
		m.payload = b[fixedReadResp:]
		if len(m.payload) > chunkSize {
			return m, fmt.Errorf("%w: read response chunk %d", errFrame, len(m.payload))
		}
		if m.status != stOK && len(m.payload) != 0 {
			return m, fmt.Errorf("%w: NAK with payload", errFrame)
		}
	case tWriteReq:
		if err := need(fixedWriteReq); err != nil {
			return m, err
		}
		m.seq, m.raddr, m.rkey = be.Uint64(b), be.Uint64(b[8:]), be.Uint32(b[16:])
		m.length, m.offset = be.Uint32(b[20:]), be.Uint32(b[24:])
		m.payload = b[fixedWriteReq:]
		if len(m.payload) > chunkSize || uint64(m.offset)+uint64(len(m.payload)) > uint64(m.length) {
			return m, fmt.Errorf("%w: write chunk %d at %d of %d", errFrame, len(m.payload), m.offset, m.length)
		}
	case tWriteAck:
		if len(b) != fixedWriteAck {
			return m, fmt.Errorf("%w: write ack length %d", errFrame, len(b))
		}
		m.seq, m.status = be.Uint64(b), b[8]
	default:
		return m, fmt.Errorf("%w: unknown type %d", errFrame, m.typ)
	}
	return m, nil
}

// readFrame reads one frame from r into buf and decodes it; frames longer
// than buf are rejected. The length prefix is checked before anything else
// is read.
func readFrame(r io.Reader, buf []byte) (msg, error) {
	var pre [4]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return msg{}, err
	}
	n := binary.BigEndian.Uint32(pre[:])
	if n < 1 || n > maxBody || int(n) > len(buf) {
		return msg{}, fmt.Errorf("%w: frame length %d", errFrame, n)
	}
	body := buf[:n]
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return msg{}, err
	}
	return decode(body)
}

// maxHelloBody is the largest body of a hello: a reader of the first frame
// of a connection never needs more, whatever length the peer announces.
const maxHelloBody = 1 + fixedHello + maxAddrLen

// readHello reads the first frame of an accepted connection with a
// hello-sized buffer (no frame buffer is taken before a valid hello) and
// fails unless it is a well-formed hello.
func readHello(r io.Reader) (msg, error) {
	var buf [maxHelloBody]byte
	m, err := readFrame(r, buf[:])
	if err != nil {
		return m, err
	}
	if m.typ != tHello {
		return msg{}, fmt.Errorf("%w: first frame of type %d, want hello", errFrame, m.typ)
	}
	return m, nil
}

// readRespHead reads a response frame off a requester's connection up to
// its payload: the prefix and fixed fields go into head, and a READ
// response's payload (payload bytes) is left in r for the caller to read
// straight into the destination memory. A frame that is not a response is
// skipped and returned with its type only (the QP fails it as a bad
// response).
func readRespHead(r io.Reader, head *[prefixLen + fixedReadResp]byte) (m msg, payload int, err error) {
	if _, err := io.ReadFull(r, head[:prefixLen]); err != nil {
		return m, 0, err
	}
	n := int(binary.BigEndian.Uint32(head[:4]))
	m.typ = head[4]
	if n < 1 || n > maxBody {
		return msg{}, 0, fmt.Errorf("%w: frame length %d", errFrame, n)
	}
	var fixed int
	switch m.typ {
	case tReadResp:
		if n < 1+fixedReadResp {
			return msg{}, 0, fmt.Errorf("%w: read response length %d", errFrame, n)
		}
		fixed = fixedReadResp
	case tWriteAck:
		if n != 1+fixedWriteAck {
			return msg{}, 0, fmt.Errorf("%w: write ack length %d", errFrame, n)
		}
		fixed = fixedWriteAck
	default:
		if _, err := io.CopyN(io.Discard, r, int64(n-1)); err != nil {
			return msg{}, 0, unexpectedEOF(err)
		}
		return msg{typ: m.typ}, 0, nil
	}
	b := head[prefixLen : prefixLen+fixed]
	if _, err := io.ReadFull(r, b); err != nil {
		return msg{}, 0, unexpectedEOF(err)
	}
	be := binary.BigEndian
	if m.typ == tWriteAck {
		m.seq, m.status = be.Uint64(b), b[8]
		return m, 0, nil
	}
	m.seq, m.status, m.offset = be.Uint64(b), b[8], be.Uint32(b[9:])
	payload = n - 1 - fixedReadResp
	if payload > chunkSize {
		return msg{}, 0, fmt.Errorf("%w: read response chunk %d", errFrame, payload)
	}
	if m.status != stOK && payload != 0 {
		return msg{}, 0, fmt.Errorf("%w: NAK with payload", errFrame)
	}
	return m, payload, nil
}

// unexpectedEOF turns io.EOF in the middle of a frame into
// io.ErrUnexpectedEOF.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// frameReader reads frames off one connection. Control frames are read
// into a small inline buffer; a frame with a payload borrows a maxBody
// buffer from bufPool until the next call (or release), so an idle
// connection holds no large buffer.
type frameReader struct {
	r     io.Reader
	pre   [4]byte // here, not on next's stack: a read into it escapes
	small [128]byte
	big   *[]byte
	// inFrame, when set, is told when a frame's body starts (true) and
	// ends (false): the responder bounds a frame begun and not finished.
	inFrame func(bool)
}

// next reads one frame; the returned payload is valid until the next call.
func (fr *frameReader) next() (msg, error) {
	fr.release()
	if _, err := io.ReadFull(fr.r, fr.pre[:]); err != nil {
		return msg{}, err
	}
	n := binary.BigEndian.Uint32(fr.pre[:])
	if n < 1 || n > maxBody {
		return msg{}, fmt.Errorf("%w: frame length %d", errFrame, n)
	}
	var body []byte
	if int(n) <= len(fr.small) {
		body = fr.small[:n]
	} else {
		fr.big = bufPool.Get().(*[]byte)
		body = (*fr.big)[:n]
	}
	if fr.inFrame != nil {
		fr.inFrame(true)
		defer fr.inFrame(false)
	}
	if _, err := io.ReadFull(fr.r, body); err != nil {
		return msg{}, unexpectedEOF(err)
	}
	return decode(body)
}

// release returns the borrowed buffer, if any.
func (fr *frameReader) release() {
	if fr.big != nil {
		bufPool.Put(fr.big)
		fr.big = nil
	}
}

// header builders: each returns prefix + fixed fields; the payload (if any)
// is written after it with writev.

func putPrefix(h []byte, typ byte, bodyLen int) []byte {
	h = binary.BigEndian.AppendUint32(h, uint32(bodyLen))
	return append(h, typ)
}

func appendHello(h []byte, srcQPN, dstQPN, srcPSN uint32, gid, secret [16]byte, addr string) []byte {
	if len(addr) > maxAddrLen {
		addr = addr[:maxAddrLen]
	}
	h = putPrefix(h, tHello, 1+fixedHello+len(addr))
	h = binary.BigEndian.AppendUint32(h, srcQPN)
	h = binary.BigEndian.AppendUint32(h, dstQPN)
	h = binary.BigEndian.AppendUint32(h, srcPSN)
	h = append(h, gid[:]...)
	h = append(h, secret[:]...)
	h = append(h, byte(len(addr)))
	return append(h, addr...)
}

func appendHelloAck(h []byte, status byte) []byte {
	h = putPrefix(h, tHelloAck, 1+fixedHelloAck)
	return append(h, status)
}

func appendReadReq(h []byte, seq, raddr uint64, rkey, n uint32) []byte {
	h = putPrefix(h, tReadReq, 1+fixedReadReq)
	h = binary.BigEndian.AppendUint64(h, seq)
	h = binary.BigEndian.AppendUint64(h, raddr)
	h = binary.BigEndian.AppendUint32(h, rkey)
	return binary.BigEndian.AppendUint32(h, n)
}

func appendReadResp(h []byte, seq uint64, status byte, offset uint32, payloadLen int) []byte {
	h = putPrefix(h, tReadResp, 1+fixedReadResp+payloadLen)
	h = binary.BigEndian.AppendUint64(h, seq)
	h = append(h, status)
	return binary.BigEndian.AppendUint32(h, offset)
}

func appendWriteReq(h []byte, seq, raddr uint64, rkey, total, offset uint32, payloadLen int) []byte {
	h = putPrefix(h, tWriteReq, 1+fixedWriteReq+payloadLen)
	h = binary.BigEndian.AppendUint64(h, seq)
	h = binary.BigEndian.AppendUint64(h, raddr)
	h = binary.BigEndian.AppendUint32(h, rkey)
	h = binary.BigEndian.AppendUint32(h, total)
	return binary.BigEndian.AppendUint32(h, offset)
}

func appendWriteAck(h []byte, seq uint64, status byte) []byte {
	h = putPrefix(h, tWriteAck, 1+fixedWriteAck)
	h = binary.BigEndian.AppendUint64(h, seq)
	return append(h, status)
}
