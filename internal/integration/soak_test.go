package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/requester"
)

// holderFaults fails QueryBlocksForTransfer at random, before its handler
// ran (nothing locked) or after (the holder locked the blocks but the
// requester gets an error and never learns the session id: only expiry can
// reclaim that session). It also counts what the handler answered, so the
// test can balance the holder's own counters exactly.
type holderFaults struct {
	pBefore, pAfter float64

	mu  sync.Mutex // guards rng
	rng *rand.Rand

	before         atomic.Int64 // failed before the handler
	afterSession   atomic.Int64 // failed after the handler opened a session
	afterEmpty     atomic.Int64 // failed after an OK answer with no session
	handlerOK      atomic.Int64 // handler returned OK (what the holder counts)
	emptyDelivered atomic.Int64 // OK, no session, delivered
	liveReleases   atomic.Int64 // ReleaseTransferLock OK with was_live
	deadReleases   atomic.Int64 // ReleaseTransferLock OK, session already ended
	queryReleases  atomic.Int64 // live releases by query id: a requester that lost the lock's answer
}

func newHolderFaults(seed uint64, pBefore, pAfter float64) *holderFaults {
	return &holderFaults{pBefore: pBefore, pAfter: pAfter, rng: rand.New(rand.NewPCG(seed, 7))}
}

func (f *holderFaults) roll() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64()
}

func (f *holderFaults) interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch info.FullMethod {
		case pegadv1.PeerService_QueryBlocksForTransfer_FullMethodName:
			p := f.roll()
			if p < f.pBefore {
				f.before.Add(1)
				return nil, status.Error(codes.Unavailable, "injected: holder error before the lock")
			}
			resp, err := handler(ctx, req)
			if err != nil {
				return resp, err
			}
			f.handlerOK.Add(1)
			hasSession := resp.(*pegadv1.QueryBlocksForTransferResponse).GetSessionId() != ""
			if p < f.pBefore+f.pAfter {
				if hasSession {
					f.afterSession.Add(1)
				} else {
					f.afterEmpty.Add(1)
				}
				return nil, status.Error(codes.Internal, "injected: holder error after the lock")
			}
			if !hasSession {
				f.emptyDelivered.Add(1)
			}
			return resp, nil
		case pegadv1.PeerService_ReleaseTransferLock_FullMethodName:
			resp, err := handler(ctx, req)
			if err == nil {
				if resp.(*pegadv1.ReleaseTransferLockResponse).GetWasLive() {
					f.liveReleases.Add(1)
					if r := req.(*pegadv1.ReleaseTransferLockRequest); r.GetSessionId() == "" && r.GetQueryId() != 0 {
						f.queryReleases.Add(1)
					}
				} else {
					f.deadReleases.Add(1)
				}
			}
			return resp, err
		}
		return handler(ctx, req)
	}
}

// Requester faults travel with each Prefetch as gRPC metadata, so the hook
// knows which fetch to hit: "panic:<phase>" panics as the fetch enters the
// phase, "hang:<phase>" blocks there until the caller's deadline cancels
// the fetch.
const faultKey = "x-test-fault"

type requesterFaults struct {
	// panics counts Prefetch calls (req_ids) that raised an injected
	// panic: one Prefetch can run more than one fetch round (a joiner whose
	// owner was cancelled fetches itself) and panic in each, but it is
	// counted once as a panicked fetch.
	panics   atomic.Int64
	panicked sync.Map     // req_id -> struct{}
	hangs    atomic.Int64 // fetches held until cancelled
}

func (f *requesterFaults) hook(ctx context.Context, reqID, phase string) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(faultKey) {
		kind, at, _ := strings.Cut(v, ":")
		if at != phase {
			continue
		}
		switch kind {
		case "panic":
			if _, seen := f.panicked.LoadOrStore(reqID, struct{}{}); !seen {
				f.panics.Add(1)
			}
			panic(fmt.Sprintf("injected panic at %s (req_id %s)", phase, reqID))
		case "hang":
			f.hangs.Add(1)
			<-ctx.Done()
		}
	}
}

var faultPhases = []string{requester.PhaseConnect, requester.PhaseLock, requester.PhaseStage,
	requester.PhaseRead, requester.PhaseRelease, requester.PhaseIndex}

// soakHolder is one holder slot; the daemon in it is replaced when killed.
type soakHolder struct {
	mu     sync.Mutex // guards n, faults, up
	n      *node
	faults *holderFaults
	up     bool
	blocks []block
	peer   string // fixed across restarts
}

func (h *soakHolder) get() (*node, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, h.up
}

// TestFaultSoak runs thousands of small fetches from three requester
// goroutines against two holders while faults of every kind are injected:
// a random client cancellation, a fetch held in a phase until its deadline,
// a panic in each phase of the fetch path, holder errors before and after
// the lock, delayed and cut data connections, and a holder killed and
// restarted on the same port and node id. At the end no holder pins
// anything, the holder's counters balance exactly (every session it opened
// ended by a release, or by expiry for precisely those whose answer was
// dropped after the lock), and every block fetched is byte-identical to
// the holder's copy.
func TestFaultSoak(t *testing.T) {
	const (
		ns          = "soak"
		workers     = 3
		perHolder   = 300
		lockTimeout = 2 * time.Second
	)
	target := int64(2400)
	if testing.Short() {
		target = 600
	}
	began := time.Now()
	rng := rand.New(rand.NewPCG(11, 5))

	holders := make([]*soakHolder, 2)
	startHolder := func(i int, listen string) *node {
		c := baseConfig(t, fmt.Sprintf("holder-%d", i))
		c.NICs = "2"
		c.TCPQPNStart = 0x800 // both holders: same QPNs
		c.LockTimeout = lockTimeout
		c.PoolSize = 16 << 20
		if listen != "" {
			c.Listen = listen
		}
		f := newHolderFaults(uint64(i)+uint64(time.Now().UnixNano()), 0.02, 0.02)
		n := start(t, c, daemon.WithPeerInterceptor(f.interceptor()))
		putAll(t, n, ns, holders[i].blocks)
		holders[i].mu.Lock()
		holders[i].n, holders[i].faults, holders[i].up = n, f, true
		holders[i].mu.Unlock()
		return n
	}
	for i := range holders {
		holders[i] = &soakHolder{blocks: randomBlocks(rng, fmt.Sprintf("h%d", i), perHolder, 1, 16<<10)}
		n := startHolder(i, "")
		holders[i].peer = n.d.PeerAddr()
	}
	expect := map[string][]byte{}
	for _, h := range holders {
		for _, b := range h.blocks {
			expect[string(b.hash)] = b.body
		}
	}

	rf := &requesterFaults{}
	rc := baseConfig(t, "requester")
	rc.NICs = "2"
	rc.PoolSize = 64 << 20
	r := start(t, rc, daemon.WithRequesterFaults(rf.hook))
	setup := time.Since(began)
	if dir := os.Getenv("SOAK_LOG_DIR"); dir != "" { // keep the logs for a post-mortem
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(dir, "requester.log"), []byte(r.logs.String()), 0o644)
			for i, h := range holders {
				n, _ := h.get()
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("holder-%d.log", i)), []byte(n.logs.String()), 0o644)
			}
		})
	}

	var (
		fetches, fetchOK, fetchErr, blocksFetched, cancels, bytesFetched atomic.Int64
		cuts, delays                                                     atomic.Int64
		killedAt, preKillQueries, queries                                atomic.Int64
		restartedAt, firstOKAfterRestart                                 atomic.Int64 // unix ns
		errMu                                                            sync.Mutex
		badData                                                          []string
	)
	soakCtx, stopSoak := context.WithCancel(context.Background())
	defer stopSoak()
	var wg sync.WaitGroup

	// Requester goroutines.
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for fetches.Load() < target && soakCtx.Err() == nil {
				hi := rng.IntN(len(holders))
				h := holders[hi]
				if _, up := h.get(); !up {
					hi = 1 - hi
					h = holders[hi]
				}
				k := 1 + rng.IntN(4)
				idx := rng.Perm(len(h.blocks))[:k]
				hashes := make([][]byte, k)
				for j, i := range idx {
					hashes[j] = h.blocks[i].hash
				}
				ctx, cancel := context.WithTimeout(soakCtx, 20*time.Second)
				switch p := rng.Float64(); {
				case p < 0.05: // cancel at a random moment
					cancels.Add(1)
					time.AfterFunc(time.Duration(rng.IntN(4000))*time.Microsecond, cancel)
				case p < 0.09: // panic in a random phase
					ctx = metadata.AppendToOutgoingContext(ctx, faultKey, "panic:"+faultPhases[rng.IntN(len(faultPhases))])
				case p < 0.12: // held in a random phase until the deadline
					short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
					outer := cancel
					cancel = func() { cancelShort(); outer() }
					ctx = metadata.AppendToOutgoingContext(short, faultKey, "hang:"+faultPhases[rng.IntN(len(faultPhases))])
				}
				resp, err := prefetch(ctx, r, h.peer, ns, hashes...)
				cancel()
				fetches.Add(1)
				if err != nil {
					fetchErr.Add(1)
					continue
				}
				fetchOK.Add(1)
				if hi == 1 && resp.GetSessionId() != "" {
					if at := restartedAt.Load(); at != 0 && firstOKAfterRestart.Load() == 0 {
						firstOKAfterRestart.CompareAndSwap(0, time.Now().UnixNano())
					}
				}
				bytesFetched.Add(int64(resp.GetBytes()))
				var got [][]byte
				for _, b := range resp.GetBlocks() {
					if b.GetStatus() == statusFetched {
						blocksFetched.Add(1)
						got = append(got, b.GetHash())
					}
				}
				// Verify what was fetched, then drop it so that later fetches
				// lock it on the holder again instead of finding it local.
				vctx, vcancel := context.WithTimeout(context.Background(), 10*time.Second)
				for _, hash := range got {
					body, err := get(vctx, r, ns, hash)
					if status.Code(err) == codes.NotFound {
						continue // another worker deleted it meanwhile
					}
					if err != nil || !bytes.Equal(body, expect[string(hash)]) {
						errMu.Lock()
						badData = append(badData, fmt.Sprintf("%s: %d bytes, %v (want %d)", hash, len(body), err, len(expect[string(hash)])))
						errMu.Unlock()
					}
					if rng.IntN(20) > 0 { // keep a few for the final comparison
						_, _ = r.local.DeleteBlock(vctx, &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: hash})
					}
				}
				vcancel()
			}
		}()
	}

	// Transport faults on the holders' data devices, and one holder kill.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
		killed := false
		for soakCtx.Err() == nil && fetches.Load() < target {
			time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond)
			if !killed && fetches.Load() > target*2/5 {
				killed = true
				h := holders[1]
				h.mu.Lock()
				old := h.n
				h.up = false
				h.mu.Unlock()
				killedAt.Store(fetches.Load())
				preKillQueries.Store(int64(old.cn.Scrape(t)[mQueryOK]))
				if err := old.close(); err != nil {
					t.Errorf("kill holder: %v", err)
				}
				startHolder(1, h.peer)
				restartedAt.Store(time.Now().UnixNano())
				continue
			}
			n, up := holders[rng.IntN(len(holders))].get()
			if !up {
				continue
			}
			devs := n.d.TCPDevices()
			dev := devs[rng.IntN(len(devs))]
			if rng.IntN(2) == 0 {
				cuts.Add(1)
				dev.CutConnections()
			} else {
				delays.Add(1)
				dev.SetFaults(tcp.Faults{ResponseDelay: time.Duration(1+rng.IntN(30)) * time.Millisecond})
				time.Sleep(time.Duration(20+rng.IntN(100)) * time.Millisecond)
				dev.SetFaults(tcp.Faults{})
			}
		}
	}()
	wg.Wait()
	soakDur := time.Since(began) - setup

	for _, s := range badData {
		t.Error("fetched block differs from the holder's copy: " + s)
	}
	if killedAt.Load() == 0 {
		t.Error("the holder kill never ran")
	}

	// Quiesce: nothing in flight on the requester, nothing pinned on the
	// holders once the sessions whose answers were dropped have expired.
	eventually(t, "requester idle", 10*time.Second, func() error {
		if v := r.cn.Scrape(t)[mFetchesInFlight]; v != 0 {
			return fmt.Errorf("%s = %v", mFetchesInFlight, v)
		}
		return nil
	})
	for i, h := range holders {
		n, _ := h.get()
		eventually(t, fmt.Sprintf("holder %d unpinned", i), lockTimeout+5*time.Second, func() error {
			m := n.cn.Scrape(t)
			if m[mSessionsActive] != 0 || m[mLockActive] != 0 {
				return fmt.Errorf("%s=%v %s=%v", mSessionsActive, m[mSessionsActive], mLockActive, m[mLockActive])
			}
			return nil
		})
		m := n.cn.Scrape(t)
		f := h.faults
		queryOK, releaseOK, timeouts := m[mQueryOK], m[mReleaseOK], m[mLockTimeouts]
		queries.Add(int64(queryOK))
		empty := float64(f.emptyDelivered.Load() + f.afterEmpty.Load())
		t.Logf("holder %d (incarnation %s): query ok %v (no session %v), release ok %v (not live %d, by query id %d), lock timeouts %v, reclaims %v, force %v; injected before %d, after-with-session %d, after-empty %d",
			i, n.d.Incarnation(), queryOK, empty, releaseOK, f.deadReleases.Load(), f.queryReleases.Load(), timeouts, m[mReclaims], m[mForceReleases],
			f.before.Load(), f.afterSession.Load(), f.afterEmpty.Load())
		if queryOK != float64(f.handlerOK.Load()) {
			t.Errorf("holder %d: query ok %v, interceptor saw %d OK answers", i, queryOK, f.handlerOK.Load())
		}
		if releaseOK != float64(f.liveReleases.Load()+f.deadReleases.Load()) {
			t.Errorf("holder %d: release ok %v, interceptor saw %d", i, releaseOK, f.liveReleases.Load()+f.deadReleases.Load())
		}
		// The invariant: every session the holder opened ended exactly once,
		// by its requester's release or, for exactly the sessions whose
		// answer was dropped after the lock, by the requester's release by
		// query id (issue 23: it releases what it abandons) or by expiry
		// (the release by query id could not reach the holder).
		if want := releaseOK - float64(f.deadReleases.Load()) + timeouts + m[mReclaims] + m[mForceReleases] + empty; queryOK != want {
			t.Errorf("holder %d: query ok %v != live releases %v + timeouts %v + reclaims %v + force %v + no-session answers %v",
				i, queryOK, releaseOK-float64(f.deadReleases.Load()), timeouts, m[mReclaims], m[mForceReleases], empty)
		}
		if byQuery := f.queryReleases.Load(); timeouts+float64(byQuery) != float64(f.afterSession.Load()) {
			t.Errorf("holder %d: %v lock timeouts + %d releases by query id, want exactly the %d sessions whose answers were dropped (a lock leaked or was released twice)",
				i, timeouts, byQuery, f.afterSession.Load())
		}
		if m[mReclaims] != 0 || m[mForceReleases] != 0 {
			t.Errorf("holder %d: unexpected reclaims %v / force releases %v", i, m[mReclaims], m[mForceReleases])
		}
	}

	rm := r.cn.Scrape(t)
	t.Logf("requester: %d fetches (%d ok, %d errors) in %v after %v setup, %d blocks / %d KiB fetched; injected: %d cancels, %d hangs, %d panics, %d holder-before, %d cuts, %d delays, holder killed at fetch %d; guard aborts %v, guard release failures %v, quarantined %v bytes, fetch totals ok=%v error=%v canceled=%v panic=%v discarded=%v",
		fetches.Load(), fetchOK.Load(), fetchErr.Load(), soakDur.Round(time.Millisecond), setup.Round(time.Millisecond),
		blocksFetched.Load(), bytesFetched.Load()>>10, cancels.Load(), rf.hangs.Load(), rf.panics.Load(),
		holders[0].faults.before.Load()+holders[1].faults.before.Load(), cuts.Load(), delays.Load(), killedAt.Load(),
		rm[mGuardAborts], rm[mGuardRelFails], rm[mQuarantined],
		rm[`pegaflow_rdma_fetch_total{status="ok"}`], rm[`pegaflow_rdma_fetch_total{status="error"}`],
		rm[`pegaflow_rdma_fetch_total{status="canceled"}`], rm[`pegaflow_rdma_fetch_total{status="panic"}`],
		rm[`pegaflow_rdma_fetch_total{status="discarded"}`])
	if fetches.Load() < target {
		t.Errorf("%d fetches, want %d", fetches.Load(), target)
	}
	queries.Add(preKillQueries.Load())
	t.Logf("holders answered %d locking queries OK (%d by the killed holder before its kill)", queries.Load(), preKillQueries.Load())
	if fetchOK.Load() < target/2 || queries.Load() < target*3/4 || blocksFetched.Load() < target {
		t.Errorf("only %d fetches ok, %d locking queries, %d blocks fetched: faults drowned the soak",
			fetchOK.Load(), queries.Load(), blocksFetched.Load())
	}
	if rf.panics.Load() == 0 || rm[`pegaflow_rdma_fetch_total{status="panic"}`] < float64(rf.panics.Load()) {
		t.Errorf("%d panics injected, %v fetches counted as panicked", rf.panics.Load(), rm[`pegaflow_rdma_fetch_total{status="panic"}`])
	}
	// The kill broke the requester's connection to that holder: it was
	// invalidated and a new handshake made, and the new holder served.
	var handshakes, invalidations float64
	for k, v := range rm {
		if strings.HasPrefix(k, `pegaflow_rdma_handshakes_total{`) && strings.Contains(k, `result="ok"`) && strings.Contains(k, `role="requester"`) {
			handshakes += v
		}
		if strings.HasPrefix(k, `pegaflow_rdma_connection_invalidations_total{`) {
			invalidations += v
		}
	}
	t.Logf("requester: %v handshakes ok, %v invalidations", handshakes, invalidations)
	if handshakes < 3 || invalidations < 1 {
		t.Errorf("requester made %v handshakes and %v invalidations: the kill and the cuts did not force reconnects", handshakes, invalidations)
	}
	if firstOKAfterRestart.Load() == 0 {
		t.Error("no fetch from the restarted holder succeeded")
	} else {
		gap := time.Duration(firstOKAfterRestart.Load() - restartedAt.Load())
		t.Logf("first fetch from the restarted holder succeeded %v after it was back", gap.Round(time.Millisecond))
	}
	if n, _ := holders[1].get(); n.cn.Scrape(t)[mReleaseOK] == 0 {
		t.Error("the restarted holder served no fetch: the requester did not reconnect")
	}
	if rm[mGuardAborts] == 0 {
		t.Error("no guard abort counted although fetches were cancelled and panicked after locking")
	}

	// Every block now on the requester equals the holder's copy.
	ctx := ctxT(t, 30*time.Second)
	checked := 0
	for _, h := range holders {
		n, _ := h.get()
		for _, b := range h.blocks {
			mine, err := get(ctx, r, ns, b.hash)
			if status.Code(err) == codes.NotFound {
				continue
			}
			theirs, herr := get(ctx, n, ns, b.hash)
			if err != nil || herr != nil || !bytes.Equal(mine, theirs) || !bytes.Equal(mine, b.body) {
				t.Errorf("block %s: requester %d bytes (%v), holder %d bytes (%v), want %d identical", b.hash, len(mine), err, len(theirs), herr, len(b.body))
			}
			checked++
		}
	}
	if checked == 0 {
		t.Error("no fetched block left to compare")
	}
	t.Logf("%d blocks on the requester compared with the holders' copies", checked)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("final comparison ran out of time")
	}
}
