package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestKVEvents: with --kv-events-endpoint, a put and a delete through the
// local API reach a ZMQ subscriber as vLLM KV events on the node's topic,
// numbered from 0; /metrics counts them. A taken port fails start-up and
// names the flag.
func TestKVEvents(t *testing.T) {
	cfg := testConfig(t)
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	n := startNode(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial("tcp://" + n.d.KVEventsAddr()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"+cfg.NodeID+"@"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); n.d.KVSubscribers() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("subscriber not seen in 10s")
		}
	}
	hash := []byte("0123456789abcdef-block")
	putBlock(t, n, "model-a", hash, []byte("kv bytes"), false)
	if _, err := n.local.DeleteBlock(ctxT(t), &pegadv1.DeleteBlockRequest{Namespace: "model-a", Hash: hash}); err != nil {
		t.Fatal(err)
	}
	for i, tag := range []string{"BlockStored", "BlockRemoved"} {
		msg, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 {
			t.Fatalf("message %d: %d frames", i, len(msg.Frames))
		}
		if got := string(msg.Frames[0]); got != "kv@"+cfg.NodeID+"@model-a" {
			t.Errorf("message %d: topic %q", i, got)
		}
		if seq := binary.BigEndian.Uint64(msg.Frames[1]); seq != uint64(i) {
			t.Errorf("message %d: sequence %d", i, seq)
		}
		// The payload holds the tag, the hash as msgpack bin 8 and "cpu".
		p := msg.Frames[2]
		for _, want := range [][]byte{[]byte(tag), append([]byte{0xc4, byte(len(hash))}, hash...), []byte("\xa3cpu")} {
			if !bytes.Contains(p, want) {
				t.Errorf("message %d: payload %x lacks %q", i, p, want)
			}
		}
	}
	m := cluster.Scrape(t, n.d.MetricsAddr())
	for k, want := range map[string]float64{
		`pegaflow_kv_events_published_total{kind="stored"}`:  1,
		`pegaflow_kv_events_published_total{kind="deleted"}`: 1,
		`pegaflow_kv_events_subscribers`:                     1,
	} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}

	// Port in use.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg2 := testConfig(t)
	cfg2.KVEventsEndpoint = "tcp://" + l.Addr().String()
	if d, err := daemon.Start(context.Background(), cfg2, daemon.WithLogger(n.d.Logger())); err == nil {
		_ = d.Close()
		t.Fatal("started with the KV-events port in use")
	} else if !strings.Contains(err.Error(), "--kv-events-endpoint") {
		t.Fatalf("error %q does not name --kv-events-endpoint", err)
	}
}

// TestKVEventsHostileFrame: one unauthenticated connection that greets
// and then declares a 2^50-byte frame ended the daemon (exit 2, zmq4's
// makeslice panic; issue 33). Now that connection alone is cut and
// counted, and the node serves puts and subscribers as before.
func TestKVEventsHostileFrame(t *testing.T) {
	cfg := testConfig(t)
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	n := startNode(t, cfg)
	nc, err := net.Dial("tcp", n.d.KVEventsAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
	copy(greeting[12:], "NULL")
	body := append([]byte{5}, "READY"...)
	body = append(append(append(body, 11), "Socket-Type"...), 0, 0, 0, 3)
	body = append(body, "SUB"...)
	ready := append([]byte{0x04, byte(len(body))}, body...) // a command frame
	bomb := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<50)
	if _, err := nc.Write(append(append(greeting, ready...), bomb...)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [256]byte
	for {
		if _, err := nc.Read(buf[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the hostile connection is still open after 5 s")
			}
			break
		}
	}
	putBlock(t, n, "model-a", []byte("0123456789abcdef-after"), []byte("kv bytes"), false)
	m := cluster.Scrape(t, n.d.MetricsAddr())
	if got := m[`pegaflow_kv_events_connections_refused_total{reason="frame"}`]; got != 1 {
		t.Errorf("refused{reason=frame} = %v, want 1", got)
	}
}
