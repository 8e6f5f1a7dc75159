package reliability

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil"
)

// Holder-side session ledger, from the metrics pegad exports today.
const (
	mQueryOK    = `pegaflow_holder_rpc_total{code="OK",rpc="query_blocks_for_transfer"}`
	mReleaseOK  = `pegaflow_holder_rpc_total{code="OK",rpc="release_transfer_lock"}`
	mNotLive    = "pegaflow_transfer_lock_release_not_live_total"
	mTimeouts   = "pegaflow_transfer_lock_timeouts_total"
	mForce      = "pegaflow_transfer_lock_force_releases_total"
	mReclaims   = "pegaflow_transfer_lock_incarnation_reclaims_total"
	mSessions   = "pegaflow_transfer_sessions_active"
	mLockActive = "pegaflow_transfer_lock_active"
	mQPs        = "pegaflow_rdma_qps"
	mWorkers    = "pegaflow_session_workers"
	mInFlight   = "pegaflow_rdma_fetches_in_flight"
	mDeferred   = "pegaflow_blocks_deferred_free"
	mQuarantine = "pegaflow_rdma_staging_quarantined_bytes"
	mPoolUsed   = "pegaflow_pool_used_bytes"
	mBlockBytes = "pegaflow_block_bytes"
	mBlocks     = "pegaflow_blocks"
	mGoroutines = "go_goroutines"
	// The holder's own ledger (pegad exports it since issue 19).
	mGranted      = "pegaflow_holder_sessions_granted_total"
	mEnds         = "pegaflow_holder_session_ends_total"
	mEmptyQueries = "pegaflow_holder_empty_queries_total"
)

// ledger is a holder's session accounting: every session granted ended
// released (live), expired, force-released or reclaimed, or is active.
type ledger struct {
	granted, released, expired, forced, reclaimed, active float64
}

func ledgerOf(m map[string]float64) ledger {
	return ledger{
		granted:   m[mQueryOK],
		released:  m[mReleaseOK] - m[mNotLive],
		expired:   m[mTimeouts],
		forced:    m[mForce],
		reclaimed: m[mReclaims],
		active:    m[mSessions],
	}
}

func (l ledger) ended() float64 { return l.released + l.expired + l.forced + l.reclaimed }

func (l ledger) String() string {
	return fmt.Sprintf("granted %.0f = released %.0f + expired %.0f + force-released %.0f + reclaimed %.0f + active %.0f",
		l.granted, l.released, l.expired, l.forced, l.reclaimed, l.active)
}

// quiet is true when a node holds nothing for a transfer: no session, no
// pinned block, no fetch in flight, no deferred free, no quarantined staging.
func quiet(m map[string]float64) bool {
	return m[mSessions] == 0 && m[mLockActive] == 0 && m[mInFlight] == 0 && m[mDeferred] == 0 && m[mQuarantine] == 0
}

// baseline is what a node looked like once started, before the faults.
type baseline struct {
	goroutines float64
	poolExtra  float64 // pool used beyond block bytes
}

// validate checks every invariant on every running node once the scenario
// is over and returns (bytes verified, wrong, leaked, problems). It waits
// up to wait for the nodes to go quiet (lock timeouts running out).
func (c *cluster) validate(wait time.Duration) (verified int64, wrong, leaked int, problems []string) {
	ctx, cancel := context.WithTimeout(context.Background(), wait+60*time.Second)
	defer cancel()
	names := make([]string, 0, len(c.nodes))
	for name := range c.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	leak := func(format string, args ...any) {
		leaked++
		problems = append(problems, "leak: "+fmt.Sprintf(format, args...))
	}
	for _, name := range names {
		n := c.nodes[name]
		if !n.running() {
			// Every daemon still serves: a scenario restarts what it kills.
			problems = append(problems, fmt.Sprintf("%s: not running at the end: %v", name, n.exited()))
			leaked++
			continue
		}
		// 1. Every stored byte is a put byte.
		infos, err := listBlocks(ctx, n)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: list blocks: %v (does not serve)", name, err))
			leaked++
			continue
		}
		for _, info := range infos {
			b, ok := c.reg.lookup(info.GetNamespace(), info.GetHash())
			if !ok {
				wrong++
				problems = append(problems, fmt.Sprintf("%s: serves block %x that no client put", name, info.GetHash()))
				continue
			}
			got, err := testutil.GetBlock(ctx, n.local, b.ns, b.hash)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: lists %s but get failed: %v", name, b.key()[:24], err))
				continue
			}
			c.hist.check("final state of "+name, b, got) // counts a mismatch
		}
		// The operator's tool still gets answers.
		if _, err := n.pegactl("stats"); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v (does not serve)", name, err))
			leaked++
		}
		// 2. Quiet within the wait: no session or pin left.
		var m map[string]float64
		end := time.Now().Add(wait)
		for {
			m, err = n.scrape()
			if err == nil && quiet(m) {
				break
			}
			if time.Now().After(end) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			problems = append(problems, err.Error())
			leaked++
			continue
		}
		for _, k := range []string{mSessions, mLockActive, mInFlight, mDeferred, mQuarantine} {
			if m[k] != 0 {
				leak("%s: %s = %.0f after %v", name, k, m[k], wait)
			}
		}
		// Pins as the store counts them (a pin without a session shows
		// only here).
		st, err := n.admin.Stats(ctx, &pegadv1.StatsRequest{})
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: stats: %v", name, err))
			leaked++
			continue
		}
		if st.GetPinnedBlocks() != 0 || st.GetLockedBlocks() != 0 || st.GetSessionsActive() != 0 {
			leak("%s: stats: %d pinned blocks, %d locked blocks, %d sessions", name, st.GetPinnedBlocks(), st.GetLockedBlocks(), st.GetSessionsActive())
		}
		// 3. The session ledger balances: from the holder's own ledger
		// metrics where it exports them, and from the RPC counters.
		l := ledgerOf(m)
		if g, ok := m[mGranted]; ok {
			// A query its client cancels after the grant is counted with
			// the client's code, not OK, yet its session was granted (and
			// ends like any other): OK queries <= granted + empty <= all.
			var ends, queries float64
			for _, o := range []string{"released", "expired", "reclaimed", "forced", "abandoned"} {
				ends += m[fmt.Sprintf(`%s{outcome="%s"}`, mEnds, o)]
			}
			for k, v := range m {
				if strings.HasPrefix(k, "pegaflow_holder_rpc_total{") && strings.Contains(k, `rpc="query_blocks_for_transfer"`) {
					queries += v
				}
			}
			if g != ends+m[mSessions] || g+m[mEmptyQueries] < m[mQueryOK] || g+m[mEmptyQueries] > queries {
				leak("%s: holder ledger: granted %.0f, ended %.0f + live %.0f; granted + empty queries %.0f, OK queries %.0f, all queries %.0f",
					name, g, ends, m[mSessions], g+m[mEmptyQueries], m[mQueryOK], queries)
			}
			if g+m[mEmptyQueries] > m[mQueryOK] {
				c.note("%s: %.0f sessions granted to queries their client had cancelled (counted as non-OK RPCs; %.0f ended at once as abandoned)",
					name, g+m[mEmptyQueries]-m[mQueryOK], m[mEnds+`{outcome="abandoned"}`])
			}
			l = ledger{granted: g, released: m[mEnds+`{outcome="released"}`], expired: m[mEnds+`{outcome="expired"}`],
				forced: m[mEnds+`{outcome="forced"}`], reclaimed: m[mEnds+`{outcome="reclaimed"}`], active: m[mSessions]}
		} else if l.ended()+l.active != l.granted && !(c.sc.emptyQueries && l.ended()+l.active < l.granted) {
			// An older pegad: the ledger from its RPC counters.
			leak("%s: session ledger (RPC counters) does not balance: %v", name, l)
		}
		// 4. QPs and workers match the connections the node lists.
		conns, err := n.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: list conns: %v", name, err))
			leaked++
			continue
		}
		var qps, reqQPs uint32
		for _, cn := range conns.GetConns() {
			qps += cn.GetQps()
			if cn.GetRole() == "requester" {
				reqQPs += cn.GetQps()
			}
			if cn.GetQps() != nics*qpsPerPeer && cn.GetState() == "connected" {
				leak("%s: connection to %s (%s) has %d QPs, want %d", name, cn.GetPeer(), cn.GetRole(), cn.GetQps(), nics*qpsPerPeer)
			}
		}
		if m[mQPs] != float64(qps) {
			leak("%s: %s = %.0f but conns list shows %d QPs", name, mQPs, m[mQPs], qps)
		}
		if m[mWorkers] != float64(reqQPs) {
			leak("%s: %s = %.0f but requester connections hold %d QPs", name, mWorkers, m[mWorkers], reqQPs)
		}
		// 5. Pool: beyond the indexed blocks (each segment rounded up to the
		// pool's alignment, at most a K and a V per block here), no more
		// than at start, plus the staging that partial prefetches share
		// with the blocks they kept (history.partial).
		base := c.base[name]
		partial := c.hist.partialBytes(name)
		if extra := m[mPoolUsed] - m[mBlockBytes]; extra > base.poolExtra+2*64*m[mBlocks]+partial {
			leak("%s: pool holds %.0f bytes beyond its %.0f blocks, %.0f at start, %.0f staged by partial prefetches", name, extra, m[mBlocks], base.poolExtra, partial)
		}
		// 6. Goroutines: at most the start's, plus what live connections own.
		if limit := base.goroutines + goroutineSlack + goroutinesPerConn*float64(len(conns.GetConns())); m[mGoroutines] > limit {
			leak("%s: %.0f goroutines, more than %.0f (start %.0f, %d conns)", name, m[mGoroutines], limit, base.goroutines, len(conns.GetConns()))
		}
		c.logf("%s: %v; %.0f QPs, %.0f workers, %.0f goroutines", name, l, m[mQPs], m[mWorkers], m[mGoroutines])
	}
	c.hist.mu.Lock()
	verified = c.hist.verified
	wrong += c.hist.wrong
	problems = append(problems, c.hist.problems...)
	c.hist.mu.Unlock()
	return verified, wrong, leaked, problems
}

// listBlocks lists every block n indexes, page by page.
func listBlocks(ctx context.Context, n *node) ([]*pegadv1.BlockInfo, error) {
	var out []*pegadv1.BlockInfo
	cursor := ""
	for {
		r, err := n.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Limit: 4096, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		out = append(out, r.GetBlocks()...)
		if cursor = r.GetNextCursor(); cursor == "" {
			return out, nil
		}
	}
}

// Goroutine budget of the leak check: a connection owns its session
// workers (one per requester QP) and a few per NIC on the holder side.
const (
	goroutineSlack    = 12
	goroutinesPerConn = 3 * nics * qpsPerPeer
)

// takeBaseline records a node's start state (after it is ready).
func (c *cluster) takeBaseline(n *node) error {
	m, err := n.scrape()
	if err != nil {
		return err
	}
	c.base[n.spec.name] = baseline{goroutines: m[mGoroutines], poolExtra: m[mPoolUsed] - m[mBlockBytes]}
	return nil
}

// summary is one line of problems for the report.
func summary(problems []string) string {
	if len(problems) > 5 {
		return strings.Join(problems[:5], "; ") + fmt.Sprintf("; ... (%d more)", len(problems)-5)
	}
	return strings.Join(problems, "; ")
}
