package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// shortErr is an error for the figures: its gRPC code and the end of its
// message (the part that says why).
func shortErr(err error) string {
	if err == nil {
		return "no error"
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	if len(msg) > 90 {
		msg = "..." + msg[len(msg)-90:]
	}
	return st.Code().String() + ": " + msg
}

func runCutHandshake(c *cluster) {
	a, b := c.n("a"), c.n("b")
	hb := c.host("b")
	var ok, failed, staleFails int
	var worst, staleWait time.Duration
	for round := range 4 {
		// A fresh B has no connection to A: its next prefetch handshakes.
		c.require(b.stop(), "restart B")
		b.start(c.t)
		bs := c.put(a, false, 1<<20)
		var r fetchResult
		if round%2 == 0 {
			// The whole link, 0-10 ms into the prefetch, for 2 s.
			ch := c.background(b, a, bs...)
			time.Sleep(time.Duration(rand.N(10)) * time.Millisecond)
			c.require(hb.linkDown(), "link down")
			c.fault("round %d: B's link cut during the handshake", round)
			time.Sleep(2 * time.Second)
			c.require(hb.linkUp(), "link up")
			r = c.await(ch, 40*time.Second, "prefetch across a cut handshake")
		} else {
			// A's data ports go silent: the query and the handshake RPC
			// succeed, the QP connections cannot be made.
			c.require(hb.blackholeFrom(dataPort, dataPort+nics-1), "blackhole")
			c.fault("round %d: A's data ports unreachable during the handshake", round)
			r = c.await(c.background(b, a, bs...), 40*time.Second, "prefetch with the data ports cut")
			c.require(hb.unfilter(), "lift blackhole")
			c.expect(r.fetched == 0, "round %d: fetched %d blocks with A's data ports unreachable", round, r.fetched)
		}
		worst = max(worst, r.took)
		if r.err == nil && r.fetched == 1 {
			ok++
		} else {
			failed++
			c.logf("round %d: %s", round, shortErr(r.err))
		}
		tries, waited := c.fetchEventually(b, a, 20*time.Second, c.put(a, true, 1<<20)...)
		if tries > 1 {
			staleFails += tries - 1
			staleWait = max(staleWait, waited)
		}
	}
	c.note("cut handshakes: %d prefetches succeeded once the link was back, %d failed cleanly (slowest %.1fs)", ok, failed, worst.Seconds())
	if staleFails > 0 {
		c.note("FINDING: after the link came back, %d prefetches failed at once with the cut-time dial error "+
			"(B's gRPC channel to A in reconnect backoff) before one succeeded %.1fs later", staleFails, staleWait.Seconds())
	}
}

func runLinkRecovery(c *cluster) {
	a, b := c.n("a"), c.n("b")
	hb := c.host("b")
	c.fetchOK(b, a, c.put(a, false, 1<<20)...) // connected before the cut
	var failFast, totalTries int
	var worstCut, worstBack time.Duration
	for round := range 3 {
		c.require(hb.linkDown(), "link down")
		c.fault("round %d: B's link down while idle", round)
		// With a 3 s prefetch timeout: the cut must not hold it longer.
		r := c.hist.prefetch(context.Background(), b, a, 3*time.Second, c.put(a, false, 256<<10)...)
		c.expect(r.fetched == 0, "round %d: fetched over a downed link", round)
		c.expect(r.took < 6*time.Second, "round %d: a prefetch with a 3 s timeout took %v over a downed link", round, r.took)
		worstCut = max(worstCut, r.took)
		if r.took < 2*time.Second {
			failFast++
		}
		time.Sleep(time.Second)
		c.require(hb.linkUp(), "link up")
		tries, took := c.fetchEventually(b, a, 30*time.Second, c.put(a, true, 1<<20)...)
		totalTries += tries
		worstBack = max(worstBack, took)
	}
	c.note("during the cut %d/3 prefetches (3 s timeout) failed within 2 s, the slowest in %.1fs; after link up it took %d prefetches to get 3 through (slowest recovery %.1fs)",
		failFast, worstCut.Seconds(), totalTries, worstBack.Seconds())
	if totalTries > 3 {
		c.note("FINDING: the first prefetch after the link came back failed at once with the cut-time dial error (B's gRPC channel to A still in reconnect backoff)")
	}
}

// fetchEventually prefetches blocks until every one is fetched, up to d,
// and returns the attempts it took and how long: a failed prefetch
// indexes nothing, so the same blocks are asked again.
func (c *cluster) fetchEventually(req, holder *node, d time.Duration, blocks ...block) (tries int, took time.Duration) {
	c.t.Helper()
	t0 := time.Now()
	for {
		tries++
		r := c.hist.prefetch(context.Background(), req, holder, 0, blocks...)
		if r.err == nil && r.fetched == len(blocks) {
			return tries, time.Since(t0)
		}
		if time.Since(t0) > d {
			c.expect(false, "%s: no prefetch from %s succeeded in %v (%d tries): %s", req.spec.name, holder.spec.name, d, tries, shortErr(r.err))
			return tries, time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func runCutRead(c *cluster) {
	a, b := c.n("a"), c.n("b")
	to0, inv0 := c.metric(a, mTimeouts), c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total")
	bs, ch := c.startSlowRead(a, b, false, 16<<20)
	time.Sleep(500 * time.Millisecond)
	c.require(c.host("b").linkDown(), "link down")
	tcut := time.Now()
	c.fault("B's link cut mid-read")
	r := c.await(ch, 30*time.Second, "prefetch over a cut link")
	took := time.Since(tcut)
	c.expect(r.err != nil || r.fetched == 0, "fetch over a cut link fetched %d", r.fetched)
	c.expect(took < 15*time.Second, "the failure took %v after the cut, want < 15 s", took)
	c.expect(c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total")-inv0 >= 1, "B invalidated no connection")
	c.waitFor(12*time.Second, "A's sweeper to expire the session", func() bool { return c.settled(a) })
	c.expect(c.metric(a, mTimeouts)-to0 == 1, "A lock timeouts %+.0f, want 1", c.metric(a, mTimeouts)-to0)
	c.require(c.host("b").linkUp(), "link up")
	c.require(c.host("a").unshape(), "unshape")
	c.fetchOK(b, a, bs...)
	c.note("fetch failed %.1fs after the cut (%s); A expired the session; refetched after link up", took.Seconds(), shortErr(r.err))
}

func runFlapRead(c *cluster) {
	a, b := c.n("a"), c.n("b")
	inv0 := c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total")
	_, ch := c.startSlowRead(a, b, false, 16<<20)
	time.Sleep(500 * time.Millisecond)
	c.require(c.host("b").linkDown(), "link down")
	c.fault("B's link flaps for 1 s mid-read")
	time.Sleep(time.Second)
	c.require(c.host("b").linkUp(), "link up")
	r := c.await(ch, 30*time.Second, "prefetch across a flap")
	c.require(c.host("a").unshape(), "unshape")
	c.expect(r.err == nil && r.fetched == 1, "fetch across a 1 s flap: %d fetched, %v", r.fetched, r.err)
	c.expect(c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total") == inv0, "B invalidated a connection across a 1 s flap")
	c.note("16 MiB across a 1 s flap in %.1fs", r.took.Seconds())
}

func runLossDelay(c *cluster) {
	a, b := c.n("a"), c.n("b")
	ha, hb := c.host("a"), c.host("b")
	how := "sch_netem: delay 50ms loss 5% on both egresses"
	var line *delayLine
	if haveNetem {
		c.require(ha.netem("delay", "50ms", "loss", "5%"), "netem a")
		c.require(hb.netem("delay", "50ms", "loss", "5%"), "netem b")
	} else {
		how = "userspace tun delay line (no sch_netem here): 50 ms each way, 5% loss each way"
		var err error
		line, err = newDelayLine(c.t, ha, hb, 50*time.Millisecond, 5)
		c.require(err, "delay line")
	}
	c.fault("%s", how)
	// The impairment is real: a TCP connect from B to A takes one RTT (the
	// fastest of 3: a lost SYN costs a 1 s retransmission).
	rtt := time.Hour
	for range 3 {
		t0 := time.Now()
		conn, err := hb.dial(context.Background(), "tcp", a.peer)
		c.require(err, "dial through the impaired path")
		conn.Close()
		rtt = min(rtt, time.Since(t0))
	}
	c.expect(rtt >= 90*time.Millisecond, "TCP connect B→A took %v: the 2 x 50 ms delay is not applied", rtt)
	t0 := time.Now()
	for range 16 {
		c.fetchOK(b, a, c.put(a, true, 512<<10, 1<<20)...)
	}
	took := time.Since(t0)
	c.expect(took < 60*time.Second, "16 prefetches took %v", took)
	if haveNetem {
		c.require(ha.unshape(), "unshape a")
		c.require(hb.unshape(), "unshape b")
	} else {
		line.close()
		c.note("%d packets delivered late, %d dropped", line.moved.Load(), line.dropped.Load())
	}
	c.note("%s: connect RTT %v; 16 prefetches (24 MiB) in %.1fs", how, rtt.Round(time.Millisecond), took.Seconds())
}

func runSlowRenewal(c *cluster) {
	a, b := c.n("a"), c.n("b")
	ren0, to0 := c.metric(a, "pegaflow_transfer_lock_renewals_total"), c.metric(a, mTimeouts)
	bs := c.put(a, false, 24<<20)
	c.require(c.host("a").slow(slowRate), "slow")
	c.fault("A's link limited to %s, lock timeout 2 s", slowRate)
	r := c.fetchOK(b, a, bs...)
	c.require(c.host("a").unshape(), "unshape")
	ren := c.metric(a, "pegaflow_transfer_lock_renewals_total") - ren0
	c.expect(r.took > 4*time.Second, "the fetch took %v, not more than two lock timeouts", r.took)
	c.expect(ren >= 2, "A counted %.0f renewals, want >= 2", ren)
	c.expect(c.metric(a, mTimeouts) == to0, "A expired a session of a renewed fetch")
	c.note("24 MiB in %.1fs with %.0f renewals, 0 lock timeouts", r.took.Seconds(), ren)
}

func runLifetimeCap(c *cluster) {
	a, b := c.n("a"), c.n("b")
	rel0, to0, nl0 := c.metric(a, mReleaseOK), c.metric(a, mTimeouts), c.metric(a, mNotLive)
	bs := c.put(a, false, 20<<20, 20<<20)
	c.require(c.host("a").slow(slowRate), "slow")
	c.fault("A's link limited to %s, lock-max-lifetime 5 s", slowRate)
	r := c.hist.prefetch(context.Background(), b, a, 0, bs...)
	c.require(c.host("a").unshape(), "unshape")
	c.expect(r.err != nil && strings.Contains(r.err.Error(), "transfer deadline"), "fetch past the lifetime cap: %v, want a transfer deadline error", r.err)
	c.expect(r.took > 4*time.Second && r.took < 9*time.Second, "failed after %v, want about 4.6 s", r.took)
	c.waitFor(10*time.Second, "A to hold no session", func() bool { return c.settled(a) })
	c.expect(c.metric(a, mReleaseOK)-rel0 == 1, "A release OK %+.0f, want 1", c.metric(a, mReleaseOK)-rel0)
	c.expect(c.metric(a, mTimeouts) == to0 && c.metric(a, mNotLive) == nl0, "A expired the session or found the release not live")
	c.note("failed after %.1fs: %s", r.took.Seconds(), shortErr(r.err))
}

func runForceRelease(c *cluster) {
	a, b := c.n("a"), c.n("b")
	fr0, nl0 := c.metric(a, mForce), c.metric(a, mNotLive)
	inv0 := c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total")
	_, ch := c.startSlowRead(a, b, true, 8<<20)
	ss := mustSessions(c, a)
	c.require(errIf(len(ss) != 1, "A holds %d sessions while B reads", len(ss)), "sessions")
	_, err := a.pegactl("locks", "release", ss[0].GetSessionId())
	c.require(err, "force release")
	c.fault("operator force-released A's session mid-read")
	r := c.await(ch, 30*time.Second, "prefetch whose lock was force-released")
	c.require(c.host("a").unshape(), "unshape")
	c.expect(r.fetched == 0, "%d blocks fetched from a force-released session", r.fetched)
	c.expect(r.err != nil && strings.Contains(r.err.Error(), "discarded") || statusOf(r) == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED,
		"want discarded: %v", r.err)
	c.expect(c.metric(a, mForce)-fr0 == 1 && c.metric(a, mNotLive)-nl0 == 1, "A force releases %+.0f, not-live releases %+.0f, want 1 and 1",
		c.metric(a, mForce)-fr0, c.metric(a, mNotLive)-nl0)
	c.expect(c.sumPrefix(b, "pegaflow_rdma_connection_invalidations_total") == inv0, "a discard invalidated B's connection")
	c.note("discarded: %s", shortErr(r.err))
}

func statusOf(r fetchResult) pegadv1.PrefetchBlockStatus {
	if r.resp == nil || len(r.resp.GetBlocks()) == 0 {
		return 0
	}
	return r.resp.GetBlocks()[0].GetStatus()
}

func errIf(cond bool, format string, args ...any) error {
	if cond {
		return fmt.Errorf(format, args...)
	}
	return nil
}

func runEvictionPinned(c *cluster) {
	a, b := c.n("a"), c.n("b")
	ev0 := c.metric(a, "pegaflow_block_evictions_total")
	_, ch := c.startSlowRead(a, b, false, 8<<20, 8<<20, 8<<20)
	c.fault("A's pool filled with new blocks while 24 MiB are pinned")
	var stored, refused int
	for range 40 {
		bl := c.reg.make(ns, 2<<20, false)
		if err := c.hist.put(context.Background(), a, bl); err != nil {
			refused++
			if code := status.Code(errors.Unwrap(err)); code == codes.Internal || code == codes.Unknown {
				c.expect(false, "put under eviction pressure failed with %v", err)
			}
			continue
		}
		stored++
	}
	r := c.await(ch, 40*time.Second, "fetch of pinned blocks")
	c.require(c.host("a").unshape(), "unshape")
	c.expect(r.err == nil && r.fetched == 3, "pinned fetch: %d fetched, %v", r.fetched, r.err)
	ev := c.metric(a, "pegaflow_block_evictions_total") - ev0
	c.expect(ev > 0, "no eviction under pressure")
	c.note("%d puts stored, %d refused, %.0f evictions while pinned; pinned blocks fetched byte-identical", stored, refused, ev)
}

func runQueryFlood(c *cluster) {
	a, b := c.n("a"), c.n("b")
	targets := c.put(a, false, make64(64, 64<<10)...)
	hashes := make([][]byte, len(targets))
	for i, bl := range targets {
		hashes[i] = bl.hash
	}
	lat := func(n int) (worst time.Duration, failed int) {
		for range n {
			r := c.hist.prefetch(context.Background(), b, a, 10*time.Second, c.put(a, false, 1<<20)...)
			if r.err != nil || r.fetched != 1 {
				failed++
			}
			worst = max(worst, r.took)
		}
		return worst, failed
	}
	before, _ := lat(5)
	rss0 := a.rssBytes()
	pc := peerClient(c.t, c.host("f"), a.peer)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var sent, okN, refused atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for ctx.Err() == nil {
				sent.Add(1)
				_, err := pc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: ns, Hashes: hashes,
					Requester: &pegadv1.Requester{NodeId: "flooder", Incarnation: "f1"}})
				switch {
				case err == nil:
					okN.Add(1)
				case ctx.Err() == nil:
					refused.Add(1)
				}
				_ = w
			}
		})
	}
	c.fault("flood: 32 streams of QueryBlocksForTransfer from one peer for 4 s")
	var peakRSS int64
	var peakSessions float64
	stop := make(chan struct{})
	var mon sync.WaitGroup
	mon.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			peakRSS = max(peakRSS, a.rssBytes())
			if m, err := a.scrape(); err == nil {
				peakSessions = max(peakSessions, m[mSessions])
			}
		}
	})
	during, failedDuring := lat(5)
	wg.Wait()
	close(stop)
	mon.Wait()
	c.expect(failedDuring == 0, "%d of B's prefetches failed during the flood", failedDuring)
	c.expect(during < 10*time.Second, "B's slowest prefetch during the flood took %v", during)
	c.expect(peakRSS < 1<<30, "A's RSS peaked at %d MiB", peakRSS>>20)
	c.waitFor(12*time.Second, "the flood's sessions to expire", func() bool { return c.settled(a) })
	after, _ := lat(2)
	c.note("%d queries (%d granted, %d refused) in 4 s; peak %.0f sessions pinning %d blocks each; A RSS %d → peak %d MiB; B prefetch worst %v before, %v during, %v after",
		sent.Load(), okN.Load(), refused.Load(), peakSessions, len(hashes), rss0>>20, peakRSS>>20,
		before.Round(time.Millisecond), during.Round(time.Millisecond), after.Round(time.Millisecond))
}

func make64(n, size int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = size
	}
	return out
}
