package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/peertls"
)

// holdFlags are `locks hold`'s own flags.
type holdFlags struct {
	peer, namespace, requester string
	hold                       time.Duration
	tls                        peertls.Files
}

// newLocksHoldCommand locks blocks on a pegad's peer port the way a
// requester does, holds the lock for a while (renewing it when the hold
// outlasts the lock timeout) and releases it: a lock to look at with
// `locks list` and `sessions list`, or to end early with `locks release`.
func newLocksHoldCommand(g *globalFlags) *cobra.Command {
	f := &holdFlags{}
	cmd := &cobra.Command{
		Use:   "hold --namespace NS [--peer HOST:PORT] [--for DUR] HEX...",
		Short: "Lock blocks on a pegad's peer port as a requester would, hold the lock, then release it",
		Long: `Lock blocks on a pegad's peer port as a requester would (QueryBlocksForTransfer), hold
the lock for --for (renewing it when that outlasts the lock timeout), then release it.
The session id is printed as soon as the lock is taken, so that "pegactl locks list",
"sessions list" and "locks release SESSION_ID" can be tried meanwhile. Ctrl-C releases
early. No data is read. On a peer port with mTLS, pass a certificate the holder accepts
(--peer-tls-cert, --peer-tls-key, --peer-tls-ca); the requester id is then its identity.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%s needs at least one block hash", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.namespace == "" {
				return usageErrorf("--namespace is required")
			}
			if f.hold <= 0 {
				return usageErrorf("invalid --for %s: must be positive", f.hold)
			}
			hashes := make([][]byte, 0, len(args))
			for _, a := range args {
				h, err := parseHash(a)
				if err != nil {
					return err
				}
				hashes = append(hashes, h)
			}
			return f.run(cmd.Context(), g, cmd.OutOrStdout(), hashes)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.peer, "peer", "127.0.0.1:50055", "the holder's peer port HOST:PORT (pegad's --listen or --advertise)")
	fl.StringVar(&f.namespace, "namespace", "", "block namespace (required)")
	fl.DurationVar(&f.hold, "for", time.Minute, "how long to hold the lock")
	fl.StringVar(&f.requester, "requester", "", "requester node id (default: pegactl@HOST, or the certificate's identity with mTLS)")
	fl.StringVar(&f.tls.Cert, "peer-tls-cert", "", "client certificate for a peer port with mTLS")
	fl.StringVar(&f.tls.Key, "peer-tls-key", "", "its key")
	fl.StringVar(&f.tls.CA, "peer-tls-ca", "", "the CA the holder's certificate chains to")
	return cmd
}

// run takes the lock, prints it, holds it and releases it.
func (f *holdFlags) run(ctx context.Context, g *globalFlags, out io.Writer, hashes [][]byte) error {
	p, err := dialPeer(f.peer, f.tls, f.requester)
	if err != nil {
		return err
	}
	defer p.Close()
	// Ctrl-C while the lock is being taken must not cancel the call: the
	// holder may have locked already, and only the reply names the session
	// to release. The hold below then ends at once and releases it.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	res, err := p.lock(qctx, f.namespace, hashes)
	cancel()
	if err != nil {
		return err
	}
	if res.GetSessionId() == "" {
		return notFoundErrorf("none of the %d blocks is on %s: nothing locked", len(hashes), f.peer)
	}
	held := &holdResult{SessionID: res.GetSessionId(), Peer: f.peer, Requester: p.requester(),
		Blocks: len(res.GetBlocks()), Missing: len(res.GetMissing()), HoldSeconds: f.hold.Seconds(),
		LockTimeoutSeconds: seconds(res.GetLockTimeout())}
	if err := g.printer(out).print(held); err != nil {
		return err
	}
	holdErr := f.holdFor(ctx, g, p, res)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	defer cancel()
	rel, err := p.release(rctx, res.GetSessionId())
	if err != nil {
		return err
	}
	if holdErr != nil {
		return holdErr
	}
	return g.printer(out).print(&holdReleased{SessionID: res.GetSessionId(), ReleasedBlocks: rel.GetReleasedBlocks(),
		WasLive: rel.GetWasLive(), End: strings.ToLower(strings.TrimPrefix(rel.GetEnd().String(), "SESSION_END_"))})
}

// holdFor waits f.hold (or until ctx ends: Ctrl-C is no error), renewing
// the lock at half its timeout whenever the hold outlasts it.
func (f *holdFlags) holdFor(ctx context.Context, g *globalFlags, p *peerClient, res *pegadv1.QueryBlocksForTransferResponse) error {
	end := time.Now().Add(f.hold)
	every := res.GetLockTimeout().AsDuration() / 2
	if every <= 0 {
		every = f.hold
	}
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		t := time.NewTimer(min(left, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if time.Until(end) <= 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, g.timeout)
		err := p.renew(rctx, res.GetSessionId())
		cancel()
		if err != nil && !errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("renew %s: %w", res.GetSessionId(), err)
		}
	}
}

// holdResult is printed once the lock is taken.
type holdResult struct {
	SessionID          string  `json:"session_id"`
	Peer               string  `json:"peer"`
	Requester          string  `json:"requester"`
	Blocks             int     `json:"blocks"`
	Missing            int     `json:"missing"`
	HoldSeconds        float64 `json:"hold_seconds"`
	LockTimeoutSeconds float64 `json:"lock_timeout_seconds"`
}

func (r *holdResult) writeTable(w io.Writer) error {
	_, err := fmt.Fprintf(w, "locked %d blocks (%d missing) on %s as %s: session %s, holding %gs (lock timeout %gs)\n",
		r.Blocks, r.Missing, r.Peer, r.Requester, r.SessionID, r.HoldSeconds, r.LockTimeoutSeconds)
	return err
}

// holdReleased is printed when the hold ends: end says how the session
// ended (released; or, when `locks release` came first, how it did).
type holdReleased struct {
	SessionID      string `json:"session_id"`
	ReleasedBlocks uint32 `json:"released_blocks"`
	WasLive        bool   `json:"was_live"`
	End            string `json:"end"`
}

func (r *holdReleased) writeTable(w io.Writer) error {
	_, err := fmt.Fprintf(w, "released session %s: %d blocks, was live %t, end %s\n", r.SessionID, r.ReleasedBlocks, r.WasLive, r.End)
	return err
}
