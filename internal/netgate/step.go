package netgate

import "bytes"

// Bytes is the Step of a protocol whose first step is its first n bytes
// (a fixed-size hello).
func Bytes(n int) Step {
	return func() func([]byte) bool {
		left := n
		return func(p []byte) bool {
			left -= len(p)
			return left <= 0
		}
	}
}

// http2Preface is the client connection preface of RFC 9113 §3.4.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// frameHeaderLen is an HTTP/2 frame header's length.
const frameHeaderLen = 9

// HTTP2 is the Step of an HTTP/2 server (gRPC): the client preface and the
// whole frame after it (which must be SETTINGS; the server checks both). A
// client that stops inside them stays half-open.
func HTTP2() Step {
	return func() func([]byte) bool {
		var head [len(http2Preface) + frameHeaderLen]byte
		seen := 0
		return func(p []byte) bool {
			if seen < len(head) {
				copy(head[seen:], p)
			}
			seen += len(p)
			if seen < len(head) {
				return false
			}
			h := head[len(http2Preface):]
			payload := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
			return seen >= len(head)+payload
		}
	}
}

// HTTP1 is the Step of an HTTP/1.x server: a request's whole header (the
// blank line that ends it), not just the request line, so that a client
// that trickles header lines stays half-open.
func HTTP1() Step {
	return func() func([]byte) bool {
		var tail []byte // the last bytes seen, at most 3, across reads
		return func(p []byte) bool {
			edge := append(tail, p[:min(len(p), 3)]...) // an end split across reads
			if endsHeader(edge) || endsHeader(p) {
				return true
			}
			tail = append(tail, p[max(0, len(p)-3):]...)
			tail = tail[max(0, len(tail)-3):]
			return false
		}
	}
}

func endsHeader(b []byte) bool {
	return bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\n\n"))
}
