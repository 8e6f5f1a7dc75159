package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/testutil"
)

// Prefill/decode handoffs between two daemons over tcp: a producer pins
// blocks for a consumer (LocalService.Handoff), the consumer pulls them
// with a prefetch naming the token, and the pin ends with that pull, its
// ttl or its release, never leaking (docs/data-path.md "Handoffs").

const (
	mHandoffsCompleted = `pegaflow_pd_handoffs_total{result="completed"}`
	mHandoffsExpired   = `pegaflow_pd_handoffs_total{result="expired"}`
	mHandoffsPending   = `pegaflow_pd_handoffs_pending`
	mHandoffAgeCount   = `pegaflow_pd_handoff_age_seconds_count`
	mPullBytes         = `pegaflow_pd_pull_bytes_total`
	mSessionsGranted   = `pegaflow_holder_sessions_granted_total`
)

// mbBlocks are n blocks of 1 MiB named prefix0, prefix1, ...
func mbBlocks(prefix string, n int) []block {
	out := make([]block, n)
	for i := range out {
		body := make([]byte, 1<<20)
		for j := range body {
			body[j] = byte(i + j*7)
		}
		out[i] = block{hash: fmt.Appendf(nil, "%s%d", prefix, i), body: body}
	}
	return out
}

func hashesOf(bs []block) [][]byte {
	out := make([][]byte, len(bs))
	for i, b := range bs {
		out[i] = b.hash
	}
	return out
}

func handoffOf(t *testing.T, n *node, ns string, bs []block, ttl time.Duration) *pegadv1.HandoffResponse {
	t.Helper()
	h, err := n.local.Handoff(ctxT(t, 10*time.Second), &pegadv1.HandoffRequest{Namespace: ns, Hashes: hashesOf(bs),
		Ttl: durationpb.New(ttl)})
	if err != nil {
		t.Fatalf("Handoff: %v", err)
	}
	return h
}

// settled waits until n pins nothing, holds no session and lists no
// pending handoff.
func settled(t *testing.T, n *node) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	eventually(t, n.cfg.NodeID+" to pin nothing", 10*time.Second, func() error {
		st := n.cn.Stats(t)
		ls, err := n.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
		if err != nil {
			return err
		}
		if st.GetPinnedBlocks() != 0 || st.GetSessionsActive() != 0 || len(ls.GetHandoffs()) != 0 {
			return fmt.Errorf("pinned %d, sessions %d, handoffs %d", st.GetPinnedBlocks(), st.GetSessionsActive(), len(ls.GetHandoffs()))
		}
		return nil
	})
}

// A handoff's blocks survive eviction pressure that evicts an unpinned
// block stored before them; the consumer's pull gets them all and ends
// the pin: nothing pinned, no session, no handoff left on the producer.
func TestHandoffPinsUntilPulled(t *testing.T) {
	prod := start(t, baseConfig(t, "producer"))
	cons := start(t, baseConfig(t, "consumer"))
	ctx := ctxT(t, 60*time.Second)
	control := mbBlocks("control", 1)
	handed := mbBlocks("kv", 4)
	putAll(t, prod, "pd", control)
	putAll(t, prod, "pd", handed)
	before := prod.cn.Stats(t).GetEvictions()
	h := handoffOf(t, prod, "pd", handed, time.Minute)
	if h.GetBlocks() != 4 || h.GetNodeId() != "producer" || h.GetPeerAddr() != prod.cn.PeerAddr() {
		t.Fatalf("Handoff = %v", h)
	}

	putAll(t, prod, "fill", mbBlocks("fill", 40)) // 40 MiB through a 32 MiB pool
	// 45 MiB put in all: at least 13 evictions. Which blocks go is the
	// policy's: under adaptive (the default) blocks put once and never
	// looked up tie, and the newest go first, so the control block may
	// stay; the handed-off blocks must, being pinned.
	if ev := prod.cn.Stats(t).GetEvictions() - before; ev < 13 {
		t.Fatalf("%d evictions while 40 MiB went through a 32 MiB pool: want at least 13", ev)
	}
	for _, b := range handed {
		if got, err := get(ctx, prod, "pd", b.hash); err != nil || string(got) != string(b.body) {
			t.Fatalf("handed-off block %s after eviction pressure: %v", b.hash, err)
		}
	}

	res, err := cons.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: h.GetPeerAddr(), Namespace: "pd",
		Hashes: hashesOf(handed), HandoffToken: h.GetToken()})
	if err != nil {
		t.Fatalf("consumer prefetch: %v", err)
	}
	for _, b := range res.GetBlocks() {
		if b.GetStatus() != statusFetched {
			t.Fatalf("block %s: %v %s", b.GetHash(), b.GetStatus(), b.GetError())
		}
	}
	settled(t, prod)
	m := prod.cn.Scrape(t)
	if m[mHandoffsCompleted] != 1 || m[mHandoffAgeCount] != 1 || m[mHandoffsPending] != 0 {
		t.Fatalf("producer: completed %v, age count %v, pending %v", m[mHandoffsCompleted], m[mHandoffAgeCount], m[mHandoffsPending])
	}
	if got := cons.cn.Scrape(t)[mPullBytes]; got != 4<<20 {
		t.Fatalf("consumer %s = %v, want %d", mPullBytes, got, 4<<20)
	}
	rel, err := prod.local.ReleaseHandoff(ctx, &pegadv1.ReleaseHandoffRequest{Token: h.GetToken()})
	if err != nil || rel.GetReleased() {
		t.Fatalf("release after the pull = %v, %v; want not released", rel, err)
	}
}

// A pull in several lock windows (a per-peer pin cap of 2 MiB: windows of
// one 1 MiB block) ends the handoff's pins window by window and completes
// it with the last.
func TestHandoffPulledInWindows(t *testing.T) {
	pcfg := baseConfig(t, "producer")
	pcfg.MaxPinnedBytesPerPeer = 2 << 20
	prod, cons := start(t, pcfg), start(t, baseConfig(t, "consumer"))
	handed := mbBlocks("kv", 5)
	putAll(t, prod, "pd", handed)
	h := handoffOf(t, prod, "pd", handed, time.Minute)
	res, err := cons.local.Prefetch(ctxT(t, 30*time.Second), &pegadv1.PrefetchRequest{Peer: h.GetPeerAddr(),
		Namespace: "pd", Hashes: hashesOf(handed), HandoffToken: h.GetToken()})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.GetBlocks() {
		if b.GetStatus() != statusFetched {
			t.Fatalf("block %s: %v %s", b.GetHash(), b.GetStatus(), b.GetError())
		}
	}
	settled(t, prod)
	m := prod.cn.Scrape(t)
	if m[mSessionsGranted] < 3 || m[mHandoffsCompleted] != 1 {
		t.Fatalf("sessions granted %v (want several windows), completed %v", m[mSessionsGranted], m[mHandoffsCompleted])
	}
}

// A handoff nobody pulls ends at its ttl (the lease sweeper), listed as
// pending until then.
func TestHandoffExpires(t *testing.T) {
	prod := start(t, baseConfig(t, "producer"))
	handed := mbBlocks("kv", 2)
	putAll(t, prod, "pd", handed)
	h := handoffOf(t, prod, "pd", handed, 500*time.Millisecond)
	ls, err := prod.admin.ListSessions(ctxT(t, 5*time.Second), &pegadv1.ListSessionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hs := ls.GetHandoffs(); len(hs) != 1 || hs[0].GetId() != h.GetToken()[:16] || hs[0].GetBlocks() != 2 ||
		hs[0].GetNamespace() != "pd" || hs[0].GetTtlLeft().AsDuration() <= 0 {
		t.Fatalf("pending handoffs = %v", hs)
	}
	if strings.Contains(fmt.Sprint(ls), h.GetToken()[16:]) {
		t.Fatal("the listing shows the token's secret")
	}
	settled(t, prod)
	if got := prod.cn.Scrape(t)[mHandoffsExpired]; got != 1 {
		t.Fatalf("%s = %v, want 1", mHandoffsExpired, got)
	}
}

// While the consumer reads, the producer lists the holder session with
// its handoff id, and the consumer its fetch with the same id.
func TestHandoffPullListed(t *testing.T) {
	reading, proceed := make(chan struct{}), make(chan struct{})
	hook := func(ctx context.Context, _, phase string) {
		if phase == requester.PhaseRead {
			close(reading)
			select {
			case <-proceed:
			case <-ctx.Done():
			}
		}
	}
	prod := start(t, baseConfig(t, "producer"))
	cons := start(t, baseConfig(t, "consumer"), daemon.WithRequesterFaults(hook))
	handed := mbBlocks("kv", 2)
	putAll(t, prod, "pd", handed)
	h := handoffOf(t, prod, "pd", handed, time.Minute)
	ctx := ctxT(t, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := cons.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: h.GetPeerAddr(), Namespace: "pd",
			Hashes: hashesOf(handed), HandoffToken: h.GetToken()})
		done <- err
	}()
	select {
	case <-reading:
	case err := <-done:
		t.Fatalf("prefetch ended before its read: %v", err)
	}
	id := h.GetToken()[:16]
	ls, err := prod.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
	if err != nil || len(ls.GetSessions()) != 1 || ls.GetSessions()[0].GetHandoffId() != id {
		t.Fatalf("producer sessions = %v, %v; want one with handoff %s", ls.GetSessions(), err, id)
	}
	lc, err := cons.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
	if err != nil || len(lc.GetFetches()) != 1 || lc.GetFetches()[0].GetHandoffId() != id {
		t.Fatalf("consumer fetches = %v, %v; want one with handoff %s", lc.GetFetches(), err, id)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	settled(t, prod)
}

// known_peer_only refuses a peer that is not a known node, before
// anything is sent to it, and counts the refusal; with a cluster index a
// live node is admitted.
func TestKnownPeerOnly(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name      string
		index     bool
		peer      func(prod *node) string
		refused   string // the refusal's pd_peer_refusals reason; "": admitted
		errorText string
	}{
		{"standalone", false, func(p *node) string { return p.cn.PeerAddr() }, "no_check", "no cluster index and no --peer-allow to check it against"},
		{"not in the index", true, func(*node) string { return "127.0.0.1:1" }, "not_in_index", `peer "127.0.0.1:1": no live node`},
		{"in the index", true, func(p *node) string { return p.cn.PeerAddr() }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pcfg, ccfg := baseConfig(t, "producer"), baseConfig(t, "consumer")
			if tc.index {
				pcfg.ClusterRedis, ccfg.ClusterRedis = r.URL(), r.URL()
				pcfg.ClusterTTL, ccfg.ClusterTTL = clusterTTL, clusterTTL
			}
			prod, cons := start(t, pcfg), start(t, ccfg)
			ctx := ctxT(t, 30*time.Second)
			if tc.index {
				eventually(t, "the producer in the index", 10*time.Second, func() error {
					res, err := clusterAPI(cons).ListNodes(ctx, &pegadv1.ListNodesRequest{})
					for _, n := range res.GetNodes() {
						if n.GetNodeId() == "producer" {
							return nil
						}
					}
					return fmt.Errorf("producer not listed (%v)", err)
				})
			}
			bs := mbBlocks("kv", 1)
			putAll(t, prod, "pd", bs)
			peer := tc.peer(prod)
			_, err := cons.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: peer, Namespace: "pd",
				Hashes: hashesOf(bs), KnownPeerOnly: true})
			granted := prod.cn.Scrape(t)[mSessionsGranted]
			if tc.refused == "" {
				if err != nil || granted != 1 {
					t.Fatalf("prefetch from a listed peer: %v (sessions granted %v)", err, granted)
				}
				return
			}
			code, reason := pegaderr.FromStatus(err)
			if code != codes.PermissionDenied || reason != pegaderr.UnknownPeer || !strings.Contains(err.Error(), tc.errorText) ||
				!strings.Contains(err.Error(), peer) {
				t.Fatalf("prefetch = %v, want PermissionDenied %s naming %s and %q", err, pegaderr.UnknownPeer, peer, tc.errorText)
			}
			if got := cons.cn.Scrape(t)[`pegaflow_pd_peer_refusals_total{reason="`+tc.refused+`"}`]; got != 1 {
				t.Fatalf("refusals{%s} = %v, want 1", tc.refused, got)
			}
			_, stderr, exit := runPegactl(cons.cn.SocketPath(), "prefetch", "--peer", peer, "--namespace", "pd",
				"--known-peer-only", fmt.Sprintf("%x", bs[0].hash))
			if exit != ctl.ExitPermission || !strings.Contains(stderr, tc.errorText) {
				t.Fatalf("pegactl prefetch --known-peer-only: exit %d, %s", exit, stderr)
			}
			if _, err := get(ctx, cons, "pd", bs[0].hash); status.Code(err) != codes.NotFound || granted != 0 {
				t.Fatalf("after a refusal: consumer has the block (%v) or the producer granted %v sessions", err, granted)
			}
		})
	}
}

// With peer mTLS and --peer-allow, known_peer_only admits a peer without
// a cluster index: the dial checks the holder's certificate against the
// list, so a holder outside it is refused there (AUTHENTICATION), with
// nothing locked.
func TestKnownPeerOnlyWithPeerAllow(t *testing.T) {
	ca := testutil.NewCA(t, "cluster")
	// Each allows itself (its start-up self-check dials its own port).
	pcfg, _ := tlsConfig(t, ca, "producer", "producer,consumer")
	ocfg, _ := tlsConfig(t, ca, "outsider", "outsider,consumer")
	ccfg, _ := tlsConfig(t, ca, "consumer", "consumer,producer")
	prod, outsider, cons := start(t, pcfg), start(t, ocfg), start(t, ccfg)
	bs := mbBlocks("kv", 1)
	putAll(t, prod, "pd", bs)
	putAll(t, outsider, "pd-outsider", bs)
	ctx := ctxT(t, 30*time.Second)
	for _, tc := range []struct {
		name   string
		holder *node
		code   codes.Code
		reason pegaderr.Reason
		ns     string
	}{
		{"allowed holder", prod, codes.OK, "", "pd"},
		{"holder off the allow-list", outsider, codes.PermissionDenied, pegaderr.Authentication, "pd-outsider"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cons.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: tc.holder.cn.PeerAddr(), Namespace: tc.ns,
				Hashes: hashesOf(bs), KnownPeerOnly: true})
			if code, reason := pegaderr.FromStatus(err); code != tc.code || reason != tc.reason {
				t.Fatalf("prefetch = %v, want %v %s", err, tc.code, tc.reason)
			}
		})
	}
	if got := outsider.cn.Scrape(t)[mSessionsGranted]; got != 0 {
		t.Fatalf("the outsider granted %v sessions", got)
	}
	if got := cons.cn.Scrape(t)[`pegaflow_pd_peer_refusals_total{reason="no_check"}`]; got != 0 {
		t.Fatalf("refused as unchecked (%v) though --peer-allow checks", got)
	}
}

// A consumer that pulls only part of a handoff (it stopped early, or had
// the rest already) ends it when done (end_handoff): the producer then
// pins nothing and lists no handoff, long before the ttl. A forged token
// (the right id, a wrong secret) ends nothing.
func TestHandoffEndedByConsumer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pull   int  // blocks of the 4 the consumer prefetches
		local  int  // blocks of the 4 the consumer holds before
		forged bool // the prefetch names a forged token
	}{
		{"pulls a prefix", 2, 0, false},
		{"has the head already", 4, 2, false},
		{"has every block", 4, 4, false},
		{"forged token", 2, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prod, cons := start(t, baseConfig(t, "producer")), start(t, baseConfig(t, "consumer"))
			ctx := ctxT(t, 30*time.Second)
			handed := mbBlocks("kv", 4)
			putAll(t, prod, "pd", handed)
			putAll(t, cons, "pd", handed[:tc.local])
			h := handoffOf(t, prod, "pd", handed, time.Minute)
			tok := h.GetToken()
			if tc.forged {
				tok = tok[:16] + strings.Repeat("0", len(tok)-16)
			}
			if _, err := cons.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: h.GetPeerAddr(), Namespace: "pd",
				Hashes: hashesOf(handed[:tc.pull]), HandoffToken: tok, EndHandoff: true}); err != nil {
				t.Fatalf("consumer prefetch: %v", err)
			}
			if tc.forged {
				eventually(t, "the consumer's end_handoff call", 10*time.Second, func() error {
					if got := prod.cn.Scrape(t)[`pegaflow_holder_rpc_total{code="OK",rpc="end_handoff"}`]; got != 1 {
						return fmt.Errorf("end_handoff OK = %v", got)
					}
					return nil
				})
				if m := prod.cn.Scrape(t); m[mHandoffsPending] != 1 || m[mHandoffsCompleted] != 0 {
					t.Fatalf("forged token: pending %v, completed %v; want the handoff untouched", m[mHandoffsPending], m[mHandoffsCompleted])
				}
				if ls, err := prod.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{}); err != nil ||
					len(ls.GetHandoffs()) != 1 || ls.GetHandoffs()[0].GetBlocks() != 4 {
					t.Fatalf("forged token: handoffs %v, %v; want one still pinning 4 blocks", ls.GetHandoffs(), err)
				}
				if _, err := prod.local.ReleaseHandoff(ctx, &pegadv1.ReleaseHandoffRequest{Token: h.GetToken()}); err != nil {
					t.Fatal(err)
				}
				settled(t, prod)
				return
			}
			settled(t, prod)
			m := prod.cn.Scrape(t)
			if m[mHandoffsCompleted] != 1 || m[mHandoffsPending] != 0 || m[mHandoffsExpired] != 0 {
				t.Fatalf("producer: completed %v, pending %v, expired %v", m[mHandoffsCompleted], m[mHandoffsPending], m[mHandoffsExpired])
			}
		})
	}
}
