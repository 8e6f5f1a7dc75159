package ctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// NewSessionsCommand groups the commands on transfer sessions.
func NewSessionsCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("sessions", "Transfer sessions: locks peers hold here, fetches this node runs")
	cmd.AddCommand(newSessionsListCommand(g))
	return cmd
}

func newSessionsListCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List holder sessions (blocks peers have locked here) and this node's in-flight fetches",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var res *pegadv1.ListSessionsResponse
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *client) error {
				// pegad answers a page of sessions at a time (fetches come
				// with the first): follow next_cursor to the end.
				req := &pegadv1.ListSessionsRequest{}
				for {
					page, err := c.admin.ListSessions(ctx, req)
					if err != nil {
						return err
					}
					if res == nil {
						res = page
					} else {
						res.Sessions = append(res.Sessions, page.GetSessions()...)
					}
					if page.GetNextCursor() == "" {
						return nil
					}
					req.Cursor = page.GetNextCursor()
				}
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(sessionsOf(res))
		},
	}
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
}

type fetchJSON struct {
	ReqID      string  `json:"req_id"`
	Peer       string  `json:"peer"`
	SessionID  string  `json:"session_id"`
	Blocks     uint32  `json:"blocks"`
	Bytes      uint64  `json:"bytes"`
	AgeSeconds float64 `json:"age_seconds"`
	Phase      string  `json:"phase"`
}

type sessionsResult struct {
	Sessions []sessionJSON `json:"sessions"`
	Fetches  []fetchJSON   `json:"fetches"`
}

func sessionsOf(res *pegadv1.ListSessionsResponse) *sessionsResult {
	out := &sessionsResult{Sessions: []sessionJSON{}, Fetches: []fetchJSON{}}
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
		})
	}
	for _, f := range res.GetFetches() {
		out.Fetches = append(out.Fetches, fetchJSON{
			ReqID:      f.GetReqId(),
			Peer:       f.GetPeer(),
			SessionID:  f.GetSessionId(),
			Blocks:     f.GetBlocks(),
			Bytes:      f.GetBytes(),
			AgeSeconds: seconds(f.GetAge()),
			Phase:      f.GetPhase(),
		})
	}
	return out
}

func (r *sessionsResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "SESSION\tREQUESTER\tBLOCKS\tBYTES\tAGE\tEXPIRES IN")
	for _, s := range r.Sessions {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", s.SessionID, dash(s.RequesterID), s.Blocks,
			humanBytes(s.Bytes), humanSeconds(s.AgeSeconds), humanSeconds(s.ExpiresInSeconds))
	}
	if len(r.Fetches) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "FETCH\tPEER\tSESSION\tBLOCKS\tBYTES\tAGE\tPHASE")
	for _, f := range r.Fetches {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", f.ReqID, f.Peer, dash(f.SessionID), f.Blocks,
			humanBytes(f.Bytes), humanSeconds(f.AgeSeconds), dash(f.Phase))
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
