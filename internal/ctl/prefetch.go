package ctl

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// prefetchGrace is how much longer than the fetch timeout pegactl waits
// for pegad's answer, so that a fetch that times out on the daemon still
// reports per-block results instead of a bare client deadline.
const prefetchGrace = 5 * time.Second

// NewPrefetchCommand makes the local pegad fetch blocks from a peer.
func NewPrefetchCommand(g *globalFlags) *cobra.Command {
	var (
		peer      string
		namespace string
		handoff   string
		knownPeer bool
	)
	cmd := &cobra.Command{
		Use:   "prefetch [--peer HOST:PORT] --namespace NS HEX...",
		Short: "Fetch blocks from a peer pegad, or without --peer from the nodes the cluster index names, into this node's pool (--timeout bounds the fetch)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%s needs at least one block hash", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			// No --peer: the cluster index finds the holders.
			if _, _, err := net.SplitHostPort(peer); peer != "" && err != nil {
				return usageErrorf("invalid --peer %q: want HOST:PORT", peer)
			}
			if namespace == "" {
				return usageErrorf("--namespace is required")
			}
			hashes := make([][]byte, 0, len(args))
			for _, a := range args {
				h, err := parseHash(a)
				if err != nil {
					return err
				}
				hashes = append(hashes, h)
			}
			wait := *g
			wait.timeout += prefetchGrace
			// More hashes than one request takes go as several, each
			// with its own --timeout (batch.go).
			res, err := prefetchInBatches(hashes, func(hashes [][]byte) (res *pegaclient.PrefetchResult, err error) {
				err = wait.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
					// A progress line on a terminal's stderr, never with -o json.
					if g.output == "table" && stderrIsTerminal(cmd.ErrOrStderr()) {
						pctx, stop := context.WithCancel(ctx)
						p := &progress{w: cmd.ErrOrStderr(), peer: peer, started: time.Now()}
						done := make(chan struct{})
						go func() { defer close(done); p.run(pctx, c) }()
						defer func() { stop(); <-done }()
					}
					// The client asks for a failure's per-block outcomes in
					// the answer, not in the status trailer, which cannot
					// carry thousands of them, and returns them beside the
					// failure's error.
					opts := []pegaclient.PrefetchOption{pegaclient.FromPeer(peer), pegaclient.WithPrefetchTimeout(g.timeout)}
					if handoff != "" {
						opts = append(opts, pegaclient.WithHandoff(handoff))
					}
					if knownPeer {
						opts = append(opts, pegaclient.KnownPeerOnly())
					}
					var err error
					res, err = c.Prefetch(ctx, namespace, hashes, opts...)
					return err
				})
				return res, err
			})
			if err != nil {
				// A failed fetch still says what happened to each block;
				// the failure's status decides the exit.
				if len(res.Blocks) > 0 {
					_ = g.printer(cmd.OutOrStdout()).print(prefetchOf(peer, namespace, res))
				}
				return err
			}
			out := prefetchOf(peer, namespace, res)
			if err := g.printer(cmd.OutOrStdout()).print(out); err != nil {
				return err
			}
			return out.err()
		},
	}
	cmd.Flags().StringVar(&peer, "peer", "", "peer pegad's gRPC address HOST:PORT (default: the holders the cluster index names)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "block namespace (required)")
	cmd.Flags().StringVar(&handoff, "handoff", "", "token of the peer's P/D handoff of these blocks: the pull ends its pin of each block read")
	cmd.Flags().BoolVar(&knownPeer, "known-peer-only", false, "refuse a --peer that is not a live node of the cluster index nor checked by --peer-allow (exit 5)")
	return cmd
}

// Prefetch block statuses as they appear in JSON.
var prefetchStatusNames = map[pegadv1.PrefetchBlockStatus]string{
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_UNSPECIFIED:     "unspecified",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED:         "fetched",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL:   "already_local",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER: "missing_on_peer",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED:          "failed",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED:       "discarded",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FOUND:       "not_found",
	pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FETCHED:     "not_fetched",
}

func prefetchStatusName(s pegadv1.PrefetchBlockStatus) string {
	if n, ok := prefetchStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("unknown(%d)", int32(s))
}

type prefetchBlockJSON struct {
	Hash   string `json:"hash"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Node served the block (prefetch without --peer).
	Node string `json:"node,omitempty"`
}

type prefetchResult struct {
	Peer            string              `json:"peer"`
	Namespace       string              `json:"namespace"`
	SessionID       string              `json:"session_id"`
	Bytes           uint64              `json:"bytes"`
	DurationSeconds float64             `json:"duration_seconds"`
	Blocks          []prefetchBlockJSON `json:"blocks"`
}

func prefetchOf(peer, ns string, res *pegaclient.PrefetchResult) *prefetchResult {
	out := &prefetchResult{
		Peer:            peer,
		Namespace:       ns,
		SessionID:       res.SessionID,
		Bytes:           res.Bytes,
		DurationSeconds: res.Duration.Seconds(),
		Blocks:          []prefetchBlockJSON{},
	}
	for _, b := range res.Blocks {
		out.Blocks = append(out.Blocks, prefetchBlockJSON{
			Hash:   hexOf(b.Hash),
			Status: prefetchStatusName(b.Status),
			Error:  cleanError(b.Err),
			Node:   b.Node,
		})
	}
	return out
}

// err is the command's outcome: every block fetched or already local is
// success; blocks the peer does not have exit with ExitNotFound; any
// failed or discarded block exits with ExitError.
func (r *prefetchResult) err() error {
	counts := map[string]int{}
	bad := 0
	for _, b := range r.Blocks {
		switch b.Status {
		case "fetched", "already_local":
		default:
			counts[b.Status]++
			bad++
		}
	}
	if bad == 0 {
		return nil
	}
	var parts []string
	for _, s := range []string{"missing_on_peer", "not_found", "not_fetched", "failed", "discarded", "unspecified"} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
			delete(counts, s)
		}
	}
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, s))
	}
	msg := fmt.Sprintf("%d of %d blocks not fetched from %s (%s)", bad, len(r.Blocks), r.source(), strings.Join(parts, ", "))
	if bad == r.countStatus("missing_on_peer")+r.countStatus("not_found") {
		return notFoundErrorf("%s", msg)
	}
	return fmt.Errorf("%s", msg)
}

func (r *prefetchResult) countStatus(s string) int {
	n := 0
	for _, b := range r.Blocks {
		if b.Status == s {
			n++
		}
	}
	return n
}

// source names where the blocks came from.
func (r *prefetchResult) source() string {
	if r.Peer == "" {
		return "the cluster"
	}
	return r.Peer
}

// writeTable prints one row per block, except that blocks which failed
// the same way share one row: the first hash and how many more. Without
// --peer a NODE column says which node served (or failed) each block.
func (r *prefetchResult) writeTable(w io.Writer) error {
	type row struct {
		b    prefetchBlockJSON
		more int
	}
	var rows []*row
	same := map[[3]string]*row{}
	for _, b := range r.Blocks {
		if b.Status == "fetched" || b.Status == "already_local" {
			rows = append(rows, &row{b: b})
			continue
		}
		k := [3]string{b.Status, b.Error, b.Node}
		if g := same[k]; g != nil {
			g.more++
			continue
		}
		g := &row{b: b}
		same[k] = g
		rows = append(rows, g)
	}
	cluster := r.Peer == ""
	if cluster {
		fmt.Fprintln(w, "HASH\tSTATUS\tNODE\tERROR")
	} else {
		fmt.Fprintln(w, "HASH\tSTATUS\tERROR")
	}
	for _, g := range rows {
		hash := g.b.Hash
		if g.more > 0 {
			hash = fmt.Sprintf("%s (+%d more)", hash, g.more)
		}
		if cluster {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", hash, g.b.Status, dash(g.b.Node), dash(g.b.Error))
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", hash, g.b.Status, dash(g.b.Error))
	}
	sess := r.SessionID
	if sess == "" {
		sess = "-"
	}
	_, err := fmt.Fprintf(w, "%s from %s in %s (session %s)\n",
		humanBytes(r.Bytes), r.source(), humanDur(time.Duration(r.DurationSeconds*float64(time.Second))), sess)
	return err
}

// grpcWrapping is the text gRPC puts around a status that was turned into
// a string and wrapped again on its way (a holder's answer inside the
// requester's error).
var grpcWrapping = regexp.MustCompile(`rpc error: code = \w+ desc = `)

// cleanError drops gRPC's wrapping from an error text: operators read
// pegad's words, once.
func cleanError(s string) string {
	return transportWrapping.ReplaceAllString(grpcWrapping.ReplaceAllString(s, ""), "$1")
}

// transportWrapping is what gRPC puts around a failure to connect (a TLS
// handshake's, a dial's) that pegad passes on.
var transportWrapping = regexp.MustCompile(`connection error: desc = "transport: (.*)"`)
