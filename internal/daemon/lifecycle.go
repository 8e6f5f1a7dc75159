package daemon

// Readiness, liveness and drain: what pegad tells systemd (READY=1,
// WATCHDOG=1, STOPPING=1), /healthz and its peers while it starts, runs and
// shuts down.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/lease"
)

// DrainingMessage is the text of the UNAVAILABLE status that new sessions,
// handshakes and prefetches get while pegad drains, and of /healthz's 503.
const DrainingMessage = "draining"

// errDraining: requesters that get it go to another holder.
var errDraining = pegaderr.Status(codes.Unavailable, pegaderr.Draining, DrainingMessage).Err()

// sweepStaleIntervals: the watchdog stops pinging when the lock sweeper has
// not ticked for this many gc-intervals (minSweepStale at least, so a
// busy machine's scheduling delay is not a failure).
const (
	sweepStaleIntervals = 5
	minSweepStale       = 2 * time.Second
)

// drainPoll is how often the drain re-checks what it waits for; drainLog
// how often it says so in the log.
const (
	drainPoll = 20 * time.Millisecond
	drainLog  = time.Second
)

// minStopGrace bounds the final stop of a server whose drain used up the
// shutdown-timeout: handlers the drain aborted get this long to answer.
const minStopGrace = 500 * time.Millisecond

// sweepClock wraps what the lease sweeper expires so the watchdog can see
// it run.
type sweepClock struct {
	lease.Expirer
	last atomic.Int64 // unix nanos of the last tick
}

func (s *sweepClock) ExpireBefore(now time.Time) int {
	s.last.Store(time.Now().UnixNano())
	return s.Expirer.ExpireBefore(now)
}

// startSweeper runs the daemon's one lease sweeper, every gc-interval,
// over its lease tables: the holder's transfer locks, the data socket's
// leases and unadopted pins, and the P/D handoffs. It stops with d.cancel
// (ctx).
func (d *Daemon) startSweeper(ctx context.Context) {
	d.sweeps.Expirer = lease.Expirers{d.holder.Locks(), d.data, d.handoffs}
	d.sweeps.last.Store(time.Now().UnixNano())
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		lease.Sweep(ctx, d.cfg.GCInterval, &d.sweeps, nil)
	}()
}

// unhealthy says why the watchdog must not ping ("" when healthy): the lock
// sweeper stalled, or a server's Serve loop ended before shutdown.
func (d *Daemon) unhealthy(now time.Time) string {
	stale := max(sweepStaleIntervals*d.cfg.GCInterval, minSweepStale)
	if last := time.Unix(0, d.sweeps.last.Load()); now.Sub(last) > stale {
		return fmt.Sprintf("lock sweeper has not run for %s", now.Sub(last).Round(time.Millisecond))
	}
	if name := d.serverDown.Load(); name != nil {
		return fmt.Sprintf("%s server is down", *name)
	}
	return ""
}

// startWatchdog pings systemd's watchdog at half its interval while the
// daemon is healthy. When it is not, pinging stops, so systemd kills and
// restarts pegad after WatchdogSec.
func (d *Daemon) startWatchdog(ctx context.Context) {
	iv, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		d.log.Warn().Err(err).Msg("Watchdog disabled: bad WATCHDOG_USEC")
		return
	}
	if iv <= 0 {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTicker(iv / 2)
		defer t.Stop()
		failing := ""
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				why := d.unhealthy(now)
				if why != "" {
					if why != failing {
						d.log.Error().Str("reason", why).Stringer("watchdog", iv).
							Msg("Unhealthy: no watchdog ping; systemd restarts pegad after the watchdog interval")
					}
					failing = why
					continue
				}
				if failing != "" {
					d.log.Info().Msg("Healthy again: watchdog pings resume")
					failing = ""
				}
				d.notify(daemon.SdNotifyWatchdog)
			}
		}
	}()
}

// checkServing proves each endpoint answers before READY=1: a health check
// over the peer port and the local socket, and a GET of /metrics.
// A start-up cancelled meanwhile (SIGTERM) does not fail it: Run shuts down
// right after.
func (d *Daemon) checkServing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, ep := range []struct {
		name, target string
		opts         []grpc.DialOption
	}{
		{"peer port", d.peerAddr, d.peerDialOptions()}, // with mTLS: as a peer, with this node's certificate
		{"local socket", "unix://" + d.socket, nil},
	} {
		cc, err := grpc.NewClient(ep.target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, ep.opts...)...)
		if err != nil {
			return fmt.Errorf("%s %s: %w", ep.name, ep.target, err)
		}
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cc.Close()
		if err != nil {
			return fmt.Errorf("%s %s does not answer: %w", ep.name, ep.target, err)
		}
	}
	if d.metricsAddr == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metricsAddr+"/metrics", nil)
	if err != nil {
		return err
	}
	// No keep-alive: no client connection outlives the check.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("metrics %s does not answer: %w", d.metricsAddr, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics %s answers %s", d.metricsAddr, resp.Status)
	}
	return nil
}

// drainInterceptor refuses, while draining, the calls that would start new
// work: a holder session or handshake on the peer port, a prefetch on the
// local socket. Everything else (reads of granted sessions, releases,
// renewals, local puts and gets, pegactl) is served until the end.
func (d *Daemon) drainInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if d.draining.Load() {
			switch info.FullMethod {
			case pegadv1.PeerService_QueryBlocksForTransfer_FullMethodName,
				pegadv1.PeerService_RdmaHandshake_FullMethodName,
				pegadv1.LocalService_Prefetch_FullMethodName,
				// A handoff here could not be pulled: new sessions are refused.
				pegadv1.LocalService_Handoff_FullMethodName:
				return nil, errDraining
			}
		}
		resp, err := handler(ctx, req)
		if info.FullMethod != pegadv1.LocalService_Prefetch_FullMethodName || !d.draining.Load() || ctx.Err() != nil {
			return resp, err
		}
		if status.Code(err) == codes.Canceled {
			return resp, shutdownAbort(err)
		}
		if r, ok := resp.(*pegadv1.PrefetchResponse); ok && err == nil && codes.Code(r.GetError().GetCode()) == codes.Canceled {
			// The same restatement when the failure is in the response
			// (PrefetchRequest.failure_in_response).
			return shutdownAbortResponse(r), nil
		}
		return resp, err
	}
}

// shutdownAbortResponse is shutdownAbort for a failure carried in the
// response.
func shutdownAbortResponse(r *pegadv1.PrefetchResponse) *pegadv1.PrefetchResponse {
	r = proto.Clone(r).(*pegadv1.PrefetchResponse)
	r.Error = &pegadv1.PrefetchFailure{Code: int32(codes.Unavailable), Message: shutdownAbortReason}
	markShutdownAborted(r)
	return r
}

func markShutdownAborted(r *pegadv1.PrefetchResponse) {
	for _, b := range r.GetBlocks() {
		if b.GetStatus() == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED {
			b.Error = "aborted: pegad shut down"
		}
	}
}

const shutdownAbortReason = "aborted: pegad shut down before the fetch finished (shutdown-timeout)"

// shutdownAbort restates a prefetch the shutdown cut short: UNAVAILABLE
// (retryable, on another node or after the restart) with a one-line
// reason, keeping the per-block results the status carries.
func shutdownAbort(err error) error {
	st := status.Convert(err)
	out := status.New(codes.Unavailable, shutdownAbortReason)
	for _, d := range st.Details() {
		res, ok := d.(*pegadv1.PrefetchResponse)
		if !ok {
			continue
		}
		res = proto.Clone(res).(*pegadv1.PrefetchResponse)
		markShutdownAborted(res)
		if ds, derr := out.WithDetails(res); derr == nil {
			out = ds
		}
	}
	return out.Err()
}

// drain waits until this node runs no fetch and holds no session for a
// peer, or until deadline, logging what it waits for. It reports whether
// everything finished in time.
func (d *Daemon) drain(deadline time.Time) bool {
	poll := time.NewTicker(drainPoll)
	defer poll.Stop()
	var lastLog time.Time
	for {
		fetches := 0
		if d.engine != nil {
			fetches = len(d.engine.InFlight())
		}
		sessions := 0
		if d.holder != nil {
			sessions = d.holder.Locks().Len()
		}
		if fetches == 0 && sessions == 0 {
			return true
		}
		now := time.Now()
		if !now.Before(deadline) {
			return false
		}
		if now.Sub(lastLog) >= drainLog {
			lastLog = now
			d.logDrain(fetches, sessions, deadline.Sub(now))
		}
		<-poll.C
	}
}

// logDrain says what the drain waits for: each fetch this node runs (the
// requester) and the sessions peers hold here (the holder).
func (d *Daemon) logDrain(fetches, sessions int, left time.Duration) {
	if fetches > 0 {
		for _, f := range d.engine.InFlight() {
			d.log.Info().Str("component", "requester").Str("req_id", f.ReqID).Str("peer", f.Peer).
				Str("session", f.SessionID).Str("phase", f.Phase).Int("blocks", f.Blocks).
				Float64("age", time.Since(f.Started).Seconds()).Float64("left", left.Seconds()).
				Msg("Draining: waiting for a fetch to finish")
		}
	}
	if sessions > 0 {
		d.log.Info().Str("component", "holder").Int("sessions", sessions).Float64("left", left.Seconds()).
			Msg("Draining: waiting for peers to release their sessions")
	}
}
