package reliability

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// rawCodec sends and receives message bytes as they are: a hostile client
// puts garbage where a protobuf message belongs. Named "proto" so the
// server decodes it with its protobuf codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*(v.(*[]byte)))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*[]byte)) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// h2Preface opens every HTTP/2 connection.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// streamPayloads are byte strings a hostile client writes on a fresh
// connection to a stream port (tcp data, peer gRPC, local socket).
func streamPayloads(r *rand.Rand, frames bool) map[string][]byte {
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	p := map[string][]byte{
		"empty":              {},
		"one byte":           {0x01},
		"random 64 B":        random(64),
		"random 4 KiB":       random(4096),
		"random 256 KiB":     random(256 << 10),
		"h2 preface only":    []byte(h2Preface),
		"h2 preface garbage": append([]byte(h2Preface), random(512)...),
		"h2 truncated frame": append([]byte(h2Preface), 0x00, 0x40, 0x00, 0x04), // a SETTINGS header cut short
		"http/1 request":     []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
	}
	if frames {
		hello := make([]byte, 5+33)
		binary.BigEndian.PutUint32(hello, 33+1)
		hello[4] = 1 // tHello
		p["tcp frame: max length"] = []byte{0xff, 0xff, 0xff, 0xff, 0x03}
		p["tcp frame: hello truncated"] = hello[:20]
		p["tcp frame: hello, random fields"] = append(hello[:5:5], random(33)...)
		rr := make([]byte, 5+24)
		binary.BigEndian.PutUint32(rr, 25)
		rr[4] = 3 // tReadReq before any hello
		copy(rr[5:], random(24))
		p["tcp frame: read before hello"] = rr
		p["tcp frame: zero length"] = []byte{0, 0, 0, 0, 4}
		p["tcp frame: unknown type"] = []byte{0, 0, 0, 1, 99, 0}
	}
	return p
}

// hostileWrite connects, writes payload, half-waits for the server's
// answer or close (bounded), and closes.
func hostileWrite(h *netns, network, addr string, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := h.dial(ctx, network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if len(payload) > 0 {
		_, _ = conn.Write(payload)
	}
	buf := make([]byte, 4096)
	_, _ = conn.Read(buf)
	return nil
}

// garbageCalls invokes every method of methods with random message bytes
// (and one truncated protobuf) through a gRPC connection from h.
func garbageCalls(ctx context.Context, h *netns, network, addr string, methods []string, r *rand.Rand) (calls int, err error) {
	conn, err := grpc.NewClient("passthrough:///x",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return h.dial(ctx, network, addr) }))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	bodies := [][]byte{
		{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},       // field 1, length 4 GiB, no bytes
		{0x12, 0x05, 0x01},                         // field 2 truncated
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // invalid tag varint
	}
	rnd := make([]byte, 300)
	for i := range rnd {
		rnd[i] = byte(r.Uint32())
	}
	bodies = append(bodies, rnd)
	for _, m := range methods {
		for _, body := range bodies {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			s, err := conn.NewStream(cctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, m, grpc.ForceCodecV2(rawCodec{}))
			if err == nil {
				in := body
				_ = s.SendMsg(&in)
				_ = s.CloseSend()
				var out []byte
				_ = s.RecvMsg(&out)
			}
			cancel()
			calls++
		}
	}
	return calls, nil
}

func runMalformed(c *cluster) {
	a, b := c.n("a"), c.n("b")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	hb := c.host("b") // hostile bytes come from B's host
	targets := []struct {
		what, network, addr string
		frames              bool
	}{
		{"peer gRPC", "tcp", a.peer, false},
		{"local socket", "unix", a.sock, false},
	}
	for _, d := range a.dataAddrs {
		targets = append(targets, struct {
			what, network, addr string
			frames              bool
		}{"tcp data " + d, "tcp", d, true})
	}
	var sent int
	for _, tg := range targets {
		h := hb
		if tg.network == "unix" {
			h = nil // a socket file: same from any namespace
		}
		for name, p := range streamPayloads(r, tg.frames) {
			if err := hostileWrite(h, tg.network, tg.addr, p); err != nil {
				c.expect(false, "%s: connect for %q: %v", tg.what, name, err)
				continue
			}
			sent++
		}
	}
	ctx := context.Background()
	peerMethods := []string{"/pegad.v1.PeerService/QueryBlocksForTransfer", "/pegad.v1.PeerService/ReleaseTransferLock",
		"/pegad.v1.PeerService/RenewTransferLock", "/pegad.v1.PeerService/RdmaHandshake", "/pegad.v1.PeerService/RdmaDisconnect"}
	localMethods := []string{"/pegad.v1.LocalService/PutBlock", "/pegad.v1.LocalService/GetBlock", "/pegad.v1.LocalService/Prefetch",
		"/pegad.v1.LocalService/DeleteBlock", "/pegad.v1.AdminService/ReleaseLock"}
	n1, err := garbageCalls(ctx, hb, "tcp", a.peer, peerMethods, r)
	c.require(err, "peer garbage calls")
	n2, err := garbageCalls(ctx, nil, "unix", a.sock, localMethods, r)
	c.require(err, "local garbage calls")
	sent += n1 + n2
	c.mu.Lock()
	c.faults += sent
	c.mu.Unlock()
	c.logf("fault: %d hostile connections and calls to A's peer port, local socket and %d tcp data ports", sent, len(a.dataAddrs))
	c.expect(a.running(), "A died under hostile bytes: %v", a.exited())
	// A still serves: a real prefetch and a local get.
	c.fetchOK(b, a, c.put(a, true, 1<<20, 64<<10)...)
	c.note("%d hostile connections/calls (%d stream payloads, %d garbage gRPC messages); A kept serving", sent, sent-n1-n2, n1+n2)
}
