package conn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/logging"
)

func TestAcceptRejectsMalformed(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2})
	good := func() *pegadv1.RdmaHandshakeRequest {
		ep := &pegadv1.Endpoint{Qpn: 0x100, Psn: 7, Addr: "127.0.0.1:9", Gid: make([]byte, 16)}
		return &pegadv1.RdmaHandshakeRequest{
			Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, Transport: "tcp", HandshakeId: "h",
			Nics: []*pegadv1.NicHandshake{{Nic: "n", Endpoints: []*pegadv1.Endpoint{ep}}},
		}
	}
	tests := []struct {
		name string
		mut  func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest
	}{
		{"nil request", func(*pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest { return nil }},
		{"no requester", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest { r.Requester = nil; return r }},
		{"empty node id", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest { r.Requester.NodeId = ""; return r }},
		{"wrong transport", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest { r.Transport = "verbs"; return r }},
		{"no nics", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest { r.Nics = nil; return r }},
		{"nil nic", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics = append(r.Nics, nil)
			return r
		}},
		{"no endpoints", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints = nil
			return r
		}},
		{"nil endpoint", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints = append(r.Nics[0].Endpoints, nil)
			return r
		}},
		{"qpn zero", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints[0].Qpn = 0
			return r
		}},
		{"qpn 25 bits", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints[0].Qpn = 1 << 24
			return r
		}},
		{"psn 25 bits", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints[0].Psn = 1 << 24
			return r
		}},
		{"short gid", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints[0].Gid = []byte{1, 2, 3}
			return r
		}},
		{"bad addr", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Endpoints[0].Addr = "nope"
			return r
		}},
		{"too many endpoints", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			for i := 0; i < maxQPsPerPeer; i++ {
				r.Nics[0].Endpoints = append(r.Nics[0].Endpoints, r.Nics[0].Endpoints[0])
			}
			return r
		}},
		{"zero-length region", func(r *pegadv1.RdmaHandshakeRequest) *pegadv1.RdmaHandshakeRequest {
			r.Nics[0].Memory = []*pegadv1.MemoryRegion{{Base: 4096}}
			return r
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := hold.acc.Accept(context.Background(), tc.mut(good()))
			if !errors.Is(err, ErrInvalidHandshake) || resp != nil {
				t.Fatalf("Accept = %v, %v; want ErrInvalidHandshake", resp, err)
			}
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Errorf("wire code %v, want InvalidArgument", c)
			}
			hold.checkQPs(t, 0)
		})
	}
	if n := len(hold.list()); n != 0 {
		t.Errorf("%d accepted connections after malformed requests", n)
	}
	// The good request is accepted (its QPs connect lazily in tcp).
	if _, err := hold.acc.Accept(context.Background(), good()); err != nil {
		t.Fatalf("good request: %v", err)
	}
	hold.checkQPs(t, 1)
}

func TestAcceptAbortsOnFailure(t *testing.T) {
	d := newDialers(t)
	var calls atomic.Int32
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, wrapDevice: func(dev ibv.Device) ibv.Device {
		return faultyDevice{Device: dev, calls: &calls, failQP: func(n int) bool { return n == 4 }}
	}})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2})
	_, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if !errors.Is(err, ErrHandshakeRejected) || !strings.Contains(err.Error(), "Aborted") {
		t.Fatalf("Get = %v, want ErrHandshakeRejected (Aborted)", err)
	}
	hold.checkQPs(t, 0)
	req.checkQPs(t, 0)
	if n := len(hold.list()); n != 0 {
		t.Errorf("holder lists %d connections after an aborted accept", n)
	}
	if got := testutil.ToFloat64(hold.met.Handshakes.WithLabelValues(RoleHolder, resultError)); got != 1 {
		t.Errorf("holder handshakes{error} = %v", got)
	}
	// The next attempt succeeds (the failure was injected once).
	if _, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr); err != nil {
		t.Fatalf("retry: %v", err)
	}
	hold.checkQPs(t, 4)
}

func TestStaleRequesterReplaced(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2})
	hold.fillRandom(8)
	old := newNode(t, d, nodeOpts{id: "req", incarnation: "one", nics: 2, qps: 2})
	if _, err := old.dial.Get(ctxT(t, 5*time.Second), hold.addr); err != nil {
		t.Fatal(err)
	}
	hold.checkQPs(t, 4)
	// "Restart": a new process with the same node id; the old one is gone
	// without telling the holder.
	restarted := newNode(t, d, nodeOpts{id: "req", incarnation: "two", nics: 2, qps: 2})
	c, err := restarted.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	hold.checkQPs(t, 4) // replaced, not added
	if got := testutil.ToFloat64(hold.met.Invalidations.WithLabelValues("replaced")); got != 1 {
		t.Errorf("holder invalidations{replaced} = %v", got)
	}
	if err := c.Read(ctxT(t, 5*time.Second), opsOf(restarted, hold, []span{{0, 0, 64 << 10}})); err != nil {
		t.Fatal(err)
	}
	checkSpans(t, restarted, hold, []span{{0, 0, 64 << 10}})
}

func TestAcceptSupersededAttemptAborts(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder"})
	mk := func(id string) *pegadv1.RdmaHandshakeRequest {
		ep := &pegadv1.Endpoint{Qpn: 0x100, Psn: 7, Addr: "127.0.0.1:9"}
		return &pegadv1.RdmaHandshakeRequest{
			Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, Transport: "tcp", HandshakeId: id,
			Nics: []*pegadv1.NicHandshake{{Nic: "n", Endpoints: []*pegadv1.Endpoint{ep, ep}}},
		}
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	hold.acc.hookAccept = func(r *pegadv1.RdmaHandshakeRequest) {
		if r.GetHandshakeId() == "old" {
			close(entered)
			<-release
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := hold.acc.Accept(context.Background(), mk("old"))
		errc <- err
	}()
	<-entered
	time.Sleep(5 * time.Millisecond) // "new" begins strictly later
	if _, err := hold.acc.Accept(context.Background(), mk("new")); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-errc; status.Code(err) != codes.Aborted {
		t.Fatalf("superseded accept = %v, want Aborted", err)
	}
	hold.checkQPs(t, 2)
	if l := hold.list(); len(l) != 1 || l[0].QPs != 2 {
		t.Fatalf("List = %+v", l)
	}
}

// A flood of malformed handshakes (issue 33: 5,000 bad calls wrote 5,000
// lines) logs the first and then at most one line per invalidLogEvery,
// which says how many were suppressed; the metric counts every one.
func TestMalformedHandshakeLogIsRateLimited(t *testing.T) {
	const calls = 5000
	var logs bytes.Buffer
	log := zerolog.New(zerolog.SyncWriter(&logs))
	hold := newNode(t, newDialers(t), nodeOpts{id: "holder", log: &log})
	bad := &pegadv1.RdmaHandshakeRequest{Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, Transport: "bogus"}
	for i := 0; i < calls; i++ {
		if _, err := hold.acc.Accept(context.Background(), bad); !errors.Is(err, ErrInvalidHandshake) {
			t.Fatalf("Accept %d = %v, want ErrInvalidHandshake", i, err)
		}
	}
	lines := strings.Count(logs.String(), "rejected malformed rdma handshake")
	if lines < 1 || lines > 2 { // a slow run may cross one interval
		t.Errorf("%d calls wrote %d warnings, want 1 (at most 2)", calls, lines)
	}
	if got := testutil.ToFloat64(hold.met.Handshakes.WithLabelValues(RoleHolder, resultInvalid)); got != calls {
		t.Errorf("invalid handshakes counted %v, want %d", got, calls)
	}

	// After the interval the next one is logged with the count it stands for.
	hold.acc.invalidLog = logging.NewLimiter(200 * time.Millisecond)
	for i := 0; i < 4; i++ { // the first is logged, the rest suppressed
		_, _ = hold.acc.Accept(context.Background(), bad)
	}
	time.Sleep(250 * time.Millisecond)
	logs.Reset()
	_, _ = hold.acc.Accept(context.Background(), bad)
	var line struct {
		Msg        string `json:"message"`
		Suppressed uint64 `json:"suppressed"`
	}
	if err := json.Unmarshal(logs.Bytes(), &line); err != nil || line.Msg != "rejected malformed rdma handshake" || line.Suppressed == 0 {
		t.Errorf("line after the interval %q (%v), want the warning with suppressed > 0", logs.String(), err)
	}
}
