package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	gid := [16]byte{1, 2, 3}
	payload := []byte("hello payload")
	tests := []struct {
		name  string
		frame []byte
		check func(m msg) bool
	}{
		{"hello", appendHello(nil, 0x100, 0x200, 0xabcdef, gid, [16]byte{7, 15: 8}, "127.0.0.1:1234"), func(m msg) bool {
			return m.srcQPN == 0x100 && m.dstQPN == 0x200 && m.srcPSN == 0xabcdef && m.gid == gid && m.secret == [16]byte{7, 15: 8} && m.addr == "127.0.0.1:1234"
		}},
		{"hello_ack", appendHelloAck(nil, stMismatch), func(m msg) bool { return m.status == stMismatch }},
		{"read_req", appendReadReq(nil, 7, 0xdead0000, 42, 1<<24), func(m msg) bool {
			return m.seq == 7 && m.raddr == 0xdead0000 && m.rkey == 42 && m.length == 1<<24
		}},
		{"read_resp", append(appendReadResp(nil, 9, stOK, 4096, len(payload)), payload...), func(m msg) bool {
			return m.seq == 9 && m.status == stOK && m.offset == 4096 && bytes.Equal(m.payload, payload)
		}},
		{"read_nak", appendReadResp(nil, 9, stRemAccess, 0, 0), func(m msg) bool { return m.status == stRemAccess }},
		{"write_req", append(appendWriteReq(nil, 3, 0x1000, 5, 100, 80, len(payload)), payload...), func(m msg) bool {
			return m.seq == 3 && m.raddr == 0x1000 && m.rkey == 5 && m.length == 100 && m.offset == 80 && bytes.Equal(m.payload, payload)
		}},
		{"write_ack", appendWriteAck(nil, 11, stOK), func(m msg) bool { return m.seq == 11 && m.status == stOK }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := readFrame(bytes.NewReader(tc.frame), make([]byte, maxBody))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if m.typ != tc.frame[4] || !tc.check(m) {
				t.Fatalf("decoded %+v", m)
			}
		})
	}
}

func TestWireRejects(t *testing.T) {
	big := binary.BigEndian.AppendUint32(nil, maxBody+1)
	tests := []struct {
		name  string
		frame []byte
	}{
		{"zero_length", []byte{0, 0, 0, 0}},
		{"huge_length", append(big, tReadResp)},
		{"unknown_type", []byte{0, 0, 0, 1, 200}},
		{"short_read_req", []byte{0, 0, 0, 3, tReadReq, 0, 0}},
		{"hello_addr_overrun", func() []byte {
			h := appendHello(nil, 1, 2, 3, [16]byte{}, [16]byte{}, "abc")
			h[len(h)-4] = 200 // address length beyond the body
			return h
		}()},
		{"hello_qpn_over_24_bits", appendHello(nil, 1<<24, 2, 3, [16]byte{}, [16]byte{}, "a")},
		{"nak_with_payload", append(appendReadResp(nil, 1, stRemAccess, 0, 2), 1, 2)},
		{"write_chunk_past_total", append(appendWriteReq(nil, 1, 0, 0, 4, 3, 2), 1, 2)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readFrame(bytes.NewReader(tc.frame), make([]byte, maxBody))
			if !errors.Is(err, errFrame) {
				t.Fatalf("err %v, want errFrame", err)
			}
		})
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame reader: it must never
// panic, never read past its buffer, and anything it accepts must respect
// the size bounds.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendHello(nil, 0x100, 0x200, 7, [16]byte{9}, [16]byte{1}, "127.0.0.1:9"))
	f.Add(appendHelloAck(nil, stOK))
	f.Add(appendReadReq(nil, 1, 2, 3, 4))
	f.Add(append(appendReadResp(nil, 1, stOK, 0, 3), 1, 2, 3))
	f.Add(append(appendWriteReq(nil, 1, 2, 3, 3, 0, 3), 1, 2, 3))
	f.Add(appendWriteAck(nil, 1, stRemAccess))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	buf := make([]byte, maxBody)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			m, err := readFrame(r, buf)
			if err != nil {
				return
			}
			if len(m.payload) > chunkSize || len(m.addr) > maxAddrLen {
				t.Fatalf("accepted oversized frame %+v", m)
			}
			if m.typ == tWriteReq && uint64(m.offset)+uint64(len(m.payload)) > uint64(m.length) {
				t.Fatalf("accepted write chunk past its total: %+v", m)
			}
		}
	})
}

// FuzzFrameReader runs the connection frame reader over arbitrary bytes.
func FuzzFrameReader(f *testing.F) {
	f.Add(append(appendReadReq(nil, 1, 2, 3, 4), appendHelloAck(nil, 0)...))
	f.Add(append(appendWriteReq(nil, 1, 2, 3, 300, 0, 200), make([]byte, 200)...))
	f.Add([]byte{0, 0, 0, 200, tReadResp, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := frameReader{r: bytes.NewReader(data)}
		defer fr.release()
		for {
			m, err := fr.next()
			if err != nil {
				return
			}
			if len(m.payload) > chunkSize {
				t.Fatalf("accepted oversized payload %d", len(m.payload))
			}
		}
	})
}

// FuzzDecodeBody feeds arbitrary frame bodies to decode directly.
func FuzzDecodeBody(f *testing.F) {
	f.Add([]byte{tHelloAck, 0})
	f.Add(appendReadReq(nil, 1, 2, 3, 4)[4:])
	f.Add(appendHello(nil, 1, 2, 3, [16]byte{}, [16]byte{}, "x")[4:])
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := decode(body)
		if err != nil {
			return
		}
		if m.typ < tHello || m.typ > tWriteAck {
			t.Fatalf("accepted type %d", m.typ)
		}
	})
}
