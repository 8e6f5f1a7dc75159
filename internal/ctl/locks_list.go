package ctl

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// lockSort are the --sort keys of locks list (they order sessions; the
// blocks of a session keep the order the requester asked for them).
var lockSort = sortKeys[lockSessionJSON]{
	"session":   by(func(s lockSessionJSON) string { return s.SessionID }),
	"requester": by(func(s lockSessionJSON) string { return s.RequesterID }),
	"blocks":    by(func(s lockSessionJSON) int { return len(s.Blocks) }),
	"bytes":     by(func(s lockSessionJSON) uint64 { return s.Bytes }),
	"age":       by(func(s lockSessionJSON) float64 { return s.AgeSeconds }),
	"expires":   by(func(s lockSessionJSON) float64 { return s.ExpiresInSeconds }),
}

func newLocksListCommand(g *globalFlags) *cobra.Command {
	return newSessionsViewCommand(g, "List the blocks peers have locked here, per holder session",
		true, lockSort, func(res *pegadv1.ListSessionsResponse, order string) result {
			out := locksOf(res)
			lockSort.apply(out.Sessions, order)
			return out
		})
}

type lockedBlockJSON struct {
	Namespace string `json:"namespace"`
	Hash      string `json:"hash"`
	Bytes     uint64 `json:"bytes"`
}

type lockSessionJSON struct {
	SessionID        string            `json:"session_id"`
	RequesterID      string            `json:"requester_id"`
	Bytes            uint64            `json:"bytes"`
	AgeSeconds       float64           `json:"age_seconds"`
	ExpiresInSeconds float64           `json:"expires_in_seconds"`
	Blocks           []lockedBlockJSON `json:"blocks"`
}

type locksResult struct {
	Sessions []lockSessionJSON `json:"sessions"`
}

func locksOf(res *pegadv1.ListSessionsResponse) *locksResult {
	out := &locksResult{Sessions: []lockSessionJSON{}}
	for _, s := range res.GetSessions() {
		ls := lockSessionJSON{
			SessionID:        s.GetSessionId(),
			RequesterID:      s.GetRequesterId(),
			Bytes:            s.GetBytes(),
			AgeSeconds:       seconds(s.GetAge()),
			ExpiresInSeconds: seconds(s.GetExpiresIn()),
			Blocks:           []lockedBlockJSON{},
		}
		for _, b := range s.GetLocked() {
			ls.Blocks = append(ls.Blocks, lockedBlockJSON{Namespace: b.GetNamespace(), Hash: hexOf(b.GetHash()), Bytes: b.GetBytes()})
		}
		out.Sessions = append(out.Sessions, ls)
	}
	return out
}

// writeTable prints one row per locked block, grouped by session.
func (r *locksResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "SESSION\tREQUESTER\tAGE\tEXPIRES IN\tNAMESPACE\tHASH\tBYTES")
	for _, s := range r.Sessions {
		if len(s.Blocks) == 0 {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t-\t-\t-\n", s.SessionID, dash(s.RequesterID),
				humanSeconds(s.AgeSeconds), humanSeconds(s.ExpiresInSeconds))
		}
		for i, b := range s.Blocks {
			id, req, age, exp := s.SessionID, dash(s.RequesterID), humanSeconds(s.AgeSeconds), humanSeconds(s.ExpiresInSeconds)
			if i > 0 { // the session's columns once per group
				id, req, age, exp = "", "", "", ""
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, req, age, exp, b.Namespace, b.Hash, humanBytes(b.Bytes))
		}
	}
	return nil
}
