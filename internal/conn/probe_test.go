package conn

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// requesterRow is r's listed requester connection to peer, if any.
func requesterRow(r *node, peer string) (ConnInfo, bool) {
	for _, ci := range r.list() {
		if ci.Role == RoleRequester && ci.Peer == peer {
			return ci, true
		}
	}
	return ConnInfo{}, false
}

// A holder that dies while its requester is idle: the keepalive READ fails
// once the QP's retry budget is spent, and the connection stops being
// listed as connected within interval + budget (issue 27, finding a).
func TestKeepaliveDropsDeadHolder(t *testing.T) {
	const interval = 100 * time.Millisecond
	attr := ibv.DefaultConnectAttr() // Timeout 14, RetryCnt 7: about 0.55 s
	budget := attr.RetryBudget()
	tests := []struct {
		name string
		kill func(h *node)
		// attr replaces the QPs' attributes, and probeTimeout the
		// manager's, when set.
		attr         *ibv.ConnectAttr
		probeTimeout time.Duration
	}{
		// Silent: no response ever comes back (a powered-off host).
		{"silent", func(h *node) {
			h.devs[0].SetFaults(tcp.Faults{DropResponses: true})
			h.devs[0].CutConnections()
		}, nil, 0},
		// Gone: the holder's process and its devices are gone (SIGKILL).
		{"closed", func(h *node) { h.srv.Stop(); h.prov.Close() }, nil, 0},
		// A provider that retries forever (rxe with retry_cnt 7): no
		// RETRY_EXC_ERR comes (a 34 s budget stands in for that), so the
		// probe's own deadline (the retry budget + slack) must end it.
		{"endless retry", func(h *node) {
			h.devs[0].SetFaults(tcp.Faults{DropResponses: true})
			h.devs[0].CutConnections()
		}, &ibv.ConnectAttr{Timeout: 20, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 16, MaxDestRd: 16, HopLimit: 64},
			budget + probeSlack},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			h := newNode(t, d, nodeOpts{id: "holder", mem: 1 << 20})
			qpAttr := &attr
			if tc.attr != nil {
				qpAttr = tc.attr
			}
			r := newNode(t, d, nodeOpts{id: "req", mem: 1 << 20, qps: 2, probeInterval: interval, connectAttr: qpAttr})
			if tc.probeTimeout > 0 {
				r.dial.probeTimeout.Store(int64(tc.probeTimeout))
			}
			c, err := r.dial.Get(ctxT(t, 5*time.Second), h.addr)
			if err != nil {
				t.Fatal(err)
			}
			if row, ok := requesterRow(r, h.addr); !ok || row.State != StateConnected {
				t.Fatalf("before the kill: row %+v listed=%v, want connected", row, ok)
			}
			tc.kill(h)
			killed := time.Now()
			limit := interval + budget + probeSlack + 2*time.Second // slack for a loaded host
			for {
				row, ok := requesterRow(r, h.addr)
				if !ok || row.State != StateConnected {
					break
				}
				if time.Since(killed) > limit {
					t.Fatalf("dead holder still listed as connected %v after the kill (interval %v, retry budget %v)",
						time.Since(killed), interval, budget)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("%s: unlisted %v after the kill (interval %v, retry budget %v)", tc.name, time.Since(killed).Round(time.Millisecond), interval, budget)
			if !c.Invalid() {
				t.Error("connection not invalidated")
			}
			waitFor(t, "QPs destroyed", func() bool { return r.nics.QPs() == 0 })
		})
	}
}

// A live, idle holder: probes keep coming (successful completions grow),
// the connection stays the same one, no handshake is repeated, and the
// probes never write into the pool.
func TestKeepaliveKeepsLiveHolder(t *testing.T) {
	const interval = 20 * time.Millisecond
	d := newDialers(t)
	h := newNode(t, d, nodeOpts{id: "holder", mem: 1 << 20, nics: 2})
	r := newNode(t, d, nodeOpts{id: "req", mem: 1 << 20, nics: 2, probeInterval: interval})
	h.fillRandom(1)
	r.fillRandom(2)
	before := bytes.Clone(r.mem)
	c, err := r.dial.Get(ctxT(t, 5*time.Second), h.addr)
	if err != nil {
		t.Fatal(err)
	}
	ok := func() float64 {
		return testutil.ToFloat64(r.met.WorkCompletions.WithLabelValues(wcLabel(ibv.WCSuccess)))
	}
	// Each tick probes both NICs: wait for several rounds.
	waitFor(t, "probes completed", func() bool { return ok() >= 10 })
	if c.Invalid() {
		t.Fatal("live connection invalidated by its keepalive")
	}
	c2, err := r.dial.Get(ctxT(t, 5*time.Second), h.addr)
	if err != nil || c2 != c {
		t.Fatalf("Get after probes = %p, %v; want the same connection %p", c2, err, c)
	}
	if n := h.handshakes.Load(); n != 1 {
		t.Errorf("handshakes = %d, want 1", n)
	}
	if !bytes.Equal(r.mem, before) {
		t.Error("keepalive READs wrote into the requester's pool")
	}
}

// A busy connection is not probed: idleFor is false while a Read holds it.
func TestKeepaliveSkipsBusyConnection(t *testing.T) {
	d := newDialers(t)
	h := newNode(t, d, nodeOpts{id: "holder"})
	r := newNode(t, d, nodeOpts{id: "req"})
	c, err := r.dial.Get(ctxT(t, 5*time.Second), h.addr)
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if !c.idleFor(later, time.Minute) {
		t.Fatal("an unused connection is not idle an hour later")
	}
	release := holdRef(t, r, c)
	if c.idleFor(later, time.Minute) {
		t.Error("a connection with a Read in flight counts as idle")
	}
	release()
	if c.idleFor(time.Now(), time.Minute) {
		t.Error("a connection used just now counts as idle for a minute")
	}
}
