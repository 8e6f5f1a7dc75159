package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rssBytes is this process's resident set size (both in-process daemons).
func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestHostileDataPortDuringFetch (issue 14): 300 connections to the
// holder's tcp data port that start a hello and never finish it (half of
// them announcing a frame far longer than any hello) neither grow the
// process by more than a few MiB nor keep a real requester from fetching
// at the same time; the holder counts what it dropped. Before the fix each
// such connection held a 1 MiB frame buffer for the 5 s hello timeout.
func TestHostileDataPortDuringFetch(t *testing.T) {
	const (
		ns      = "hostile"
		hostile = 300
	)
	rng := rand.New(rand.NewPCG(14, 14))
	h := start(t, baseConfig(t, "holder"))
	warm := randomBlocks(rng, "w", 4, 64<<10, 512<<10)
	blocks := randomBlocks(rng, "h", 8, 64<<10, 512<<10)
	putAll(t, h, ns, append(warm, blocks...))
	r := start(t, baseConfig(t, "requester"))
	dataAddr := h.d.TCPDevices()[0].Info().Addr
	fetchAll := func(bs []block) {
		t.Helper()
		var hashes [][]byte
		for _, b := range bs {
			hashes = append(hashes, b.hash)
		}
		resp, err := prefetch(ctxT(t, 30*time.Second), r, h.d.PeerAddr(), ns, hashes...)
		if err != nil {
			t.Fatal(err)
		}
		for i, st := range resp.GetBlocks() {
			if st.GetStatus() != statusFetched {
				t.Fatalf("block %d: %v", i, st.GetStatus())
			}
		}
		for _, b := range bs {
			got, err := get(ctxT(t, 10*time.Second), r, ns, b.hash)
			if err != nil || !bytes.Equal(got, b.body) {
				t.Fatalf("block %s after the fetch: %v", b.hash, err)
			}
		}
	}
	fetchAll(warm) // the data plane's buffers exist before the baseline

	before := rssBytes(t)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// One frame of each kind, reused: the test's own allocations stay out
	// of the RSS figure.
	// The longest hello: prefix, type, 45 fixed bytes (QPNs, PSN, GID,
	// the handshake secret, address length), a 255-byte address.
	frames := [2][]byte{make([]byte, 4+1+45+255-1), make([]byte, 4+1<<20+64-1)}
	for _, f := range frames {
		binary.BigEndian.PutUint32(f, uint32(len(f)-4+1))
		f[4] = 1 // hello
	}
	for i := range hostile {
		c, err := net.Dial("tcp", dataAddr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		// All of the announced frame (the longest hello, or the longest
		// frame) but its last byte, as an attacker who wants the holder
		// to fill, not just reserve, a buffer does.
		_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Write(frames[i%2]) // the holder may drop it first: that is the point
	}
	eventually(t, "holder answered every hostile connection", 10*time.Second, func() error {
		m := h.cn.Scrape(t)
		if got := m[mRefusedBadHello] + m[mRefusedSourceLimit]; got < hostile/2 {
			return fmt.Errorf("%v dropped", got)
		}
		return nil
	})
	grew := rssBytes(t) - before
	t.Logf("RSS grew by %.1f MiB with %d hostile pre-hello connections", float64(grew)/(1<<20), hostile)
	limit := int64(4 << 20)
	if raceEnabled {
		limit = 24 << 20 // the race detector's shadow of goroutine stacks
	}
	if grew > limit {
		t.Fatalf("RSS grew by %d MiB, want under %d MiB", grew>>20, limit>>20)
	}
	// While they hold (or are evicted from) their slots, a real fetch.
	fetchAll(blocks)
	m := h.cn.Scrape(t)
	if dropped := m[mRefusedBadHello] + m[mRefusedSourceLimit]; dropped < hostile/2 {
		t.Fatalf("holder dropped %v hostile connections, want at least %d (the over-long ones)", dropped, hostile/2)
	}
}

const (
	mRefusedBadHello    = `pegaflow_tcp_data_conns_refused_total{reason="bad_hello"}`
	mRefusedSourceLimit = `pegaflow_tcp_data_conns_refused_total{reason="source_limit"}`
)
