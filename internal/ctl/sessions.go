package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// NewSessionsCommand groups the commands on transfer sessions.
func NewSessionsCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("sessions", "Transfer sessions: locks peers hold here, fetches this node runs")
	cmd.AddCommand(newSessionsListCommand(g))
	return cmd
}

// listSessions reads every page of sessions (pegad answers a page at a
// time, fetches with the first): it follows next_cursor to the end.
func listSessions(ctx context.Context, c *pegaclient.Client, includeBlocks bool) (*pegadv1.ListSessionsResponse, error) {
	var res *pegadv1.ListSessionsResponse
	req := &pegadv1.ListSessionsRequest{IncludeBlocks: includeBlocks}
	for {
		page, err := c.Admin().ListSessions(ctx, req)
		if err != nil {
			return nil, err
		}
		if res == nil {
			res = page // fetches and pending handoffs come with the first page
		} else {
			res.Sessions = append(res.Sessions, page.GetSessions()...)
		}
		if page.GetNextCursor() == "" {
			return res, nil
		}
		req.Cursor = page.GetNextCursor()
	}
}

// sessionSort and fetchSort are the --sort keys of sessions list; a key
// sorts both tables (requester: a fetch's peer; expires: sessions only).
var (
	sessionSort = sortKeys[sessionJSON]{
		"age":       by(func(s sessionJSON) float64 { return s.AgeSeconds }),
		"bytes":     by(func(s sessionJSON) uint64 { return s.Bytes }),
		"blocks":    by(func(s sessionJSON) uint32 { return s.Blocks }),
		"requester": by(func(s sessionJSON) string { return s.RequesterID }),
		"expires":   by(func(s sessionJSON) float64 { return s.ExpiresInSeconds }),
	}
	fetchSort = sortKeys[fetchJSON]{
		"age":       by(func(f fetchJSON) float64 { return f.AgeSeconds }),
		"bytes":     by(func(f fetchJSON) uint64 { return f.Bytes }),
		"blocks":    by(func(f fetchJSON) uint32 { return f.Blocks }),
		"requester": by(func(f fetchJSON) string { return f.Peer }),
		"expires":   func(a, b fetchJSON) int { return 0 },
	}
)

func newSessionsListCommand(g *globalFlags) *cobra.Command {
	return newSessionsViewCommand(g, "List holder sessions (blocks peers have locked here) and this node's in-flight fetches",
		false, sessionSort, func(res *pegadv1.ListSessionsResponse, order string) result {
			out := sessionsOf(res)
			sessionSort.apply(out.Sessions, order)
			fetchSort.apply(out.Fetches, order)
			return out
		})
}

// newSessionsViewCommand is the shape `sessions list` and `locks list`
// share: check --sort against keys, read every page of ListSessions (with
// each session's blocks when includeBlocks), and print view's result of
// it, once or every --watch.
func newSessionsViewCommand[T any](g *globalFlags, short string, includeBlocks bool, keys sortKeys[T],
	view func(res *pegadv1.ListSessionsResponse, order string) result) *cobra.Command {
	var (
		watch time.Duration
		order string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := keys.check(order); err != nil {
				return err
			}
			return g.repeat(cmd, watch, func(ctx context.Context, c *pegaclient.Client) (result, error) {
				res, err := listSessions(ctx, c, includeBlocks)
				if err != nil {
					return nil, err
				}
				return view(res, order), nil
			})
		},
	}
	addWatchFlag(cmd, &watch)
	addSortFlag(cmd, &order, keys)
	return cmd
}

type sessionJSON struct {
	SessionID            string  `json:"session_id"`
	RequesterID          string  `json:"requester_id"`
	RequesterIncarnation string  `json:"requester_incarnation"`
	Blocks               uint32  `json:"blocks"`
	Bytes                uint64  `json:"bytes"`
	CreatedAt            string  `json:"created_at"`
	AgeSeconds           float64 `json:"age_seconds"`
	ExpiresInSeconds     float64 `json:"expires_in_seconds"`
	Renewals             uint32  `json:"renewals"`
	// HandoffID: the P/D handoff the session pulls ("" when none).
	HandoffID string `json:"handoff_id"`
}

type fetchJSON struct {
	ReqID      string  `json:"req_id"`
	Peer       string  `json:"peer"`
	SessionID  string  `json:"session_id"`
	Blocks     uint32  `json:"blocks"`
	Bytes      uint64  `json:"bytes"`
	BytesDone  uint64  `json:"bytes_done"`
	AgeSeconds float64 `json:"age_seconds"`
	Phase      string  `json:"phase"`
	HandoffID  string  `json:"handoff_id"`
}

// handoffJSON is a handoff pending on this node (blocks pinned for a
// consumer's pull).
type handoffJSON struct {
	ID             string  `json:"id"`
	Namespace      string  `json:"namespace"`
	Blocks         uint32  `json:"blocks"`
	BlocksTotal    uint32  `json:"blocks_total"`
	Bytes          uint64  `json:"bytes"`
	AgeSeconds     float64 `json:"age_seconds"`
	TTLLeftSeconds float64 `json:"ttl_left_seconds"`
}

type sessionsResult struct {
	Sessions []sessionJSON `json:"sessions"`
	Fetches  []fetchJSON   `json:"fetches"`
	Handoffs []handoffJSON `json:"handoffs"`
}

func sessionsOf(res *pegadv1.ListSessionsResponse) *sessionsResult {
	out := &sessionsResult{Sessions: []sessionJSON{}, Fetches: []fetchJSON{}, Handoffs: []handoffJSON{}}
	for _, s := range res.GetSessions() {
		out.Sessions = append(out.Sessions, sessionJSON{
			SessionID:            s.GetSessionId(),
			RequesterID:          s.GetRequesterId(),
			RequesterIncarnation: s.GetRequesterIncarnation(),
			Blocks:               s.GetBlocks(),
			Bytes:                s.GetBytes(),
			CreatedAt:            timestamp(s.GetCreatedAt()),
			AgeSeconds:           seconds(s.GetAge()),
			ExpiresInSeconds:     seconds(s.GetExpiresIn()),
			Renewals:             s.GetRenewals(),
			HandoffID:            s.GetHandoffId(),
		})
	}
	for _, f := range res.GetFetches() {
		out.Fetches = append(out.Fetches, fetchJSON{
			ReqID:      f.GetReqId(),
			Peer:       f.GetPeer(),
			SessionID:  f.GetSessionId(),
			Blocks:     f.GetBlocks(),
			Bytes:      f.GetBytes(),
			BytesDone:  f.GetBytesDone(),
			AgeSeconds: seconds(f.GetAge()),
			Phase:      f.GetPhase(),
			HandoffID:  f.GetHandoffId(),
		})
	}
	for _, h := range res.GetHandoffs() {
		out.Handoffs = append(out.Handoffs, handoffJSON{
			ID: h.GetId(), Namespace: h.GetNamespace(), Blocks: h.GetBlocks(), BlocksTotal: h.GetBlocksTotal(),
			Bytes: h.GetBytes(), AgeSeconds: seconds(h.GetAge()), TTLLeftSeconds: seconds(h.GetTtlLeft()),
		})
	}
	return out
}

func (r *sessionsResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "SESSION\tREQUESTER\tBLOCKS\tBYTES\tAGE\tEXPIRES IN\tHANDOFF")
	for _, s := range r.Sessions {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", s.SessionID, dash(s.RequesterID), s.Blocks,
			humanBytes(s.Bytes), humanSeconds(s.AgeSeconds), humanSeconds(s.ExpiresInSeconds), dash(s.HandoffID))
	}
	if len(r.Fetches) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "FETCH\tPEER\tSESSION\tBLOCKS\tDONE\tAGE\tPHASE\tHANDOFF")
		for _, f := range r.Fetches {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s of %s\t%s\t%s\t%s\n", f.ReqID, f.Peer, dash(f.SessionID), f.Blocks,
				humanBytes(f.BytesDone), humanBytes(f.Bytes), humanSeconds(f.AgeSeconds), dash(f.Phase), dash(f.HandoffID))
		}
	}
	if len(r.Handoffs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "HANDOFF\tNAMESPACE\tBLOCKS\tBYTES\tAGE\tTTL LEFT")
		for _, h := range r.Handoffs {
			fmt.Fprintf(w, "%s\t%s\t%d of %d\t%s\t%s\t%s\n", h.ID, h.Namespace, h.Blocks, h.BlocksTotal,
				humanBytes(h.Bytes), humanSeconds(h.AgeSeconds), humanSeconds(h.TTLLeftSeconds))
		}
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
