package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// The server side of ZMTP 3.x (rfc.zeromq.org/spec/23 and /37) over the
// NULL mechanism: the greeting, the READY handshake, and frames. It is
// written here rather than taken from a ZeroMQ library because anyone who
// can reach the KV-events port sends these bytes: every length is read and
// bounded before anything is allocated for it (maxFrame), every property
// and socket type is checked before it is used, and a violation is an
// error that ends that one connection. go-zeromq/zmq4, used before, let one
// frame header declaring 2^50 bytes panic the daemon and 2^36 exhaust its
// memory (issue 33). Only what a PUB or ROUTER server needs is here: no
// client side, no other mechanism, no ZMTP 1.0/2.0 fallback (libzmq has
// spoken 3.x since 4.0, 2013).

// Frame flags (ZMTP 3.1 §"Framing").
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	flagsKnown  = flagMore | flagLong | flagCommand
)

const (
	greetingLen = 64
	// maxFrame bounds one inbound frame, command or message. What a PUB
	// or ROUTER here receives is small: a subscription (a topic prefix;
	// pegad's topics are node and model names), a READY's metadata, an
	// 8-byte replay request. A longer frame ends the connection unread.
	maxFrame = 4096
	// maxFrames bounds the frames of one inbound message (a replay
	// request has two: the REQ delimiter and the sequence).
	maxFrames = 4
	// maxPingContext: ZMTP 3.1 §PING, a context of at most 16 octets.
	maxPingContext = 16
)

// Errors of the handshake and the framing; each ends the connection, and
// each wraps errProtocol, so that a caller can tell a peer's violation
// from a closed or timed-out connection.
var (
	errProtocol      = errors.New("zmtp protocol violation")
	errGreeting      = fmt.Errorf("%w: malformed greeting", errProtocol)
	errMechanism     = fmt.Errorf("%w: only the NULL mechanism is served", errProtocol)
	errVersion       = fmt.Errorf("%w: peer speaks a ZMTP version before 3.0", errProtocol)
	errFrame         = fmt.Errorf("%w: malformed frame", errProtocol)
	errFrameTooLarge = fmt.Errorf("%w: frame larger than allowed", errProtocol)
	errTooManyFrames = fmt.Errorf("%w: message has too many frames", errProtocol)
	errMetadata      = fmt.Errorf("%w: malformed metadata", errProtocol)
	errSocketType    = fmt.Errorf("%w: incompatible socket type", errProtocol)
	errPeerError     = errors.New("zmtp: peer sent ERROR")
)

// zmtpConn is one accepted ZMTP connection. The reader side (recv) is
// used by one goroutine; send may be called from another (the subscriber's
// writer) and from recv itself (PONG), so writes are serialized by wmu.
type zmtpConn struct {
	nc       net.Conn
	r        *bufio.Reader
	peerType string // the peer's Socket-Type, upper case

	wmu sync.Mutex // guards w and every write to nc
	w   *bufio.Writer
}

// zmtpMsg is one inbound message, or a subscription carried by a ZMTP 3.1
// SUBSCRIBE or CANCEL command (sub set, frames nil).
type zmtpMsg struct {
	frames [][]byte
	sub    *subscription
}

type subscription struct {
	on    bool
	topic []byte
}

// greeting is what this server sends: signature, version 3.1, NULL,
// as-server 0 (the NULL mechanism has no roles), filler.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xFF, 0x7F
	g[10], g[11] = 3, 1
	copy(g[12:32], nullMechanism[:])
	return g
}

// nullMechanism is the greeting's mechanism field: "NULL", zero-padded.
var nullMechanism = [20]byte{'N', 'U', 'L', 'L'}

// compatible lists, per socket type this side serves, the peer types
// ZMTP's socket rules (rfc 28, 29, 47) allow.
var compatible = map[string][]string{
	"PUB":    {"SUB", "XSUB"},
	"ROUTER": {"DEALER", "REQ", "ROUTER"},
}

// zmtpAccept runs the greeting and the NULL handshake as a server of
// socketType on nc. The caller bounds it with a deadline on nc.
func zmtpAccept(nc net.Conn, socketType string) (*zmtpConn, error) {
	c := &zmtpConn{nc: nc, r: bufio.NewReaderSize(nc, maxFrame), w: bufio.NewWriterSize(nc, maxFrame)}
	// Both sides send their greeting at once (libzmq sends its signature
	// and waits for ours), so ours goes first, whole.
	if _, err := nc.Write(greeting()); err != nil {
		return nil, fmt.Errorf("zmtp: send greeting: %w", err)
	}
	var g [greetingLen]byte
	if _, err := io.ReadFull(c.r, g[:]); err != nil {
		return nil, fmt.Errorf("zmtp: read greeting: %w", err)
	}
	if err := checkGreeting(g[:]); err != nil {
		return nil, err
	}
	if err := c.sendCommand("READY", appendProperty(nil, "Socket-Type", socketType)); err != nil {
		return nil, err
	}
	name, body, err := c.readCommand()
	if err != nil {
		return nil, err
	}
	switch name {
	case "READY":
	case "ERROR":
		return nil, fmt.Errorf("%w during handshake: %q", errPeerError, errorReason(body))
	default:
		return nil, fmt.Errorf("%w: handshake command %q, want READY", errFrame, name)
	}
	props, err := parseMetadata(body)
	if err != nil {
		return nil, err
	}
	c.peerType = strings.ToUpper(string(props["socket-type"]))
	ok := false
	for _, t := range compatible[socketType] {
		ok = ok || c.peerType == t
	}
	if !ok {
		// rfc 37: a peer with an incompatible socket type gets ERROR.
		_ = c.sendCommand("ERROR", errorBody("invalid socket type"))
		return nil, fmt.Errorf("%w: %q connecting to %s", errSocketType, c.peerType, socketType)
	}
	return c, nil
}

func checkGreeting(g []byte) error {
	if g[0] != 0xFF || g[9] != 0x7F {
		return errGreeting
	}
	if g[10] < 3 {
		return fmt.Errorf("%w (%d.%d)", errVersion, g[10], g[11])
	}
	if !bytes.Equal(g[12:32], nullMechanism[:]) {
		return errMechanism
	}
	return nil
}

// readFrame reads one frame, bounded by maxFrame before it is allocated.
func (c *zmtpConn) readFrame() (flags byte, body []byte, err error) {
	if flags, err = c.r.ReadByte(); err != nil {
		return 0, nil, err
	}
	if flags&^flagsKnown != 0 {
		return 0, nil, fmt.Errorf("%w: reserved flag bits %#x", errFrame, flags)
	}
	if flags&flagCommand != 0 && flags&flagMore != 0 {
		return 0, nil, fmt.Errorf("%w: command with MORE", errFrame)
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err = io.ReadFull(c.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		s, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(s)
	}
	if size > maxFrame {
		return 0, nil, fmt.Errorf("%w: %d bytes, at most %d", errFrameTooLarge, size, maxFrame)
	}
	body = make([]byte, size)
	if _, err = io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// readCommand reads one frame that must be a command, and splits it.
func (c *zmtpConn) readCommand() (string, []byte, error) {
	flags, body, err := c.readFrame()
	if err != nil {
		return "", nil, err
	}
	if flags&flagCommand == 0 {
		return "", nil, fmt.Errorf("%w: message before READY", errFrame)
	}
	return splitCommand(body)
}

func splitCommand(body []byte) (string, []byte, error) {
	if len(body) < 1 || int(body[0]) == 0 || len(body) < 1+int(body[0]) {
		return "", nil, fmt.Errorf("%w: command name", errFrame)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// recv returns the next message or subscription. PING is answered and
// other commands are skipped, as rfc 37 asks of unknown ones.
func (c *zmtpConn) recv() (zmtpMsg, error) {
	var frames [][]byte
	for {
		flags, body, err := c.readFrame()
		if err != nil {
			return zmtpMsg{}, err
		}
		if flags&flagCommand != 0 {
			if frames != nil {
				return zmtpMsg{}, fmt.Errorf("%w: command inside a message", errFrame)
			}
			m, ok, err := c.command(body)
			if err != nil || ok {
				return m, err
			}
			continue
		}
		if len(frames) == maxFrames {
			return zmtpMsg{}, fmt.Errorf("%w: more than %d", errTooManyFrames, maxFrames)
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			return zmtpMsg{frames: frames}, nil
		}
	}
}

// command handles one command after the handshake; ok reports that it is
// a subscription to hand up.
func (c *zmtpConn) command(body []byte) (m zmtpMsg, ok bool, err error) {
	name, data, err := splitCommand(body)
	if err != nil {
		return m, false, err
	}
	switch name {
	case "SUBSCRIBE", "CANCEL": // ZMTP 3.1
		return zmtpMsg{sub: &subscription{on: name == "SUBSCRIBE", topic: data}}, true, nil
	case "PING":
		if len(data) < 2 || len(data)-2 > maxPingContext {
			return m, false, fmt.Errorf("%w: PING of %d bytes", errFrame, len(data))
		}
		return m, false, c.sendCommand("PONG", data[2:])
	case "ERROR":
		return m, false, fmt.Errorf("%w: %q", errPeerError, errorReason(data))
	case "READY":
		return m, false, fmt.Errorf("%w: second READY", errFrame)
	}
	return m, false, nil
}

// parseMetadata reads READY's properties (rfc 37: name-size octet, name,
// 4-octet value-size, value), names matched case-insensitively.
func parseMetadata(b []byte) (map[string][]byte, error) {
	props := map[string][]byte{}
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: property name", errMetadata)
		}
		name := b[1 : 1+n]
		for _, ch := range name {
			if !validNameChar(ch) {
				return nil, fmt.Errorf("%w: property name %q", errMetadata, name)
			}
		}
		v := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(v) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: property %q value of %d bytes, %d left", errMetadata, name, v, len(b))
		}
		props[strings.ToLower(string(name))] = b[:v]
		b = b[v:]
	}
	return props, nil
}

// validNameChar: rfc 37's name = 1*255name-char, ALPHA / DIGIT / "-" /
// "_" / "." / "+".
func validNameChar(ch byte) bool {
	return ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
		ch == '-' || ch == '_' || ch == '.' || ch == '+'
}

func appendProperty(b []byte, name, value string) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func errorBody(reason string) []byte { return append([]byte{byte(len(reason))}, reason...) }

func errorReason(data []byte) string {
	if len(data) == 0 || len(data) < 1+int(data[0]) {
		return ""
	}
	return string(data[1 : 1+int(data[0])])
}

// sendCommand writes one command frame.
func (c *zmtpConn) sendCommand(name string, data []byte) error {
	body := append(append([]byte{byte(len(name))}, name...), data...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeFrame(flagCommand, body)
	return c.flushLocked()
}

// send writes one message of frames.
func (c *zmtpConn) send(frames ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, f := range frames {
		var more byte
		if i < len(frames)-1 {
			more = flagMore
		}
		c.writeFrame(more, f)
	}
	return c.flushLocked()
}

// writeFrame buffers one frame; errors surface at flush. wmu is held.
func (c *zmtpConn) writeFrame(flags byte, body []byte) {
	if len(body) > 255 {
		var h [9]byte
		h[0] = flags | flagLong
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		_, _ = c.w.Write(h[:])
	} else {
		_, _ = c.w.Write([]byte{flags, byte(len(body))})
	}
	_, _ = c.w.Write(body)
}

func (c *zmtpConn) flushLocked() error {
	if err := c.w.Flush(); err != nil {
		return fmt.Errorf("zmtp: send: %w", err)
	}
	return nil
}

func (c *zmtpConn) Close() error { return c.nc.Close() }
