package ctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// NewLocksCommand groups the commands on holder locks.
func NewLocksCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("locks", "Holder locks (transfer sessions peers hold on this node's blocks)")
	cmd.AddCommand(newLocksListCommand(g), newLocksReleaseCommand(g), newLocksHoldCommand(g))
	return cmd
}

func newLocksReleaseCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "release SESSION_ID",
		Short: "Force-release a holder session; pegad logs it with user@host",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("%s takes exactly one SESSION_ID, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if id == "" {
				return usageErrorf("empty SESSION_ID")
			}
			op := operator()
			var res *pegadv1.ReleaseLockResponse
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				var err error
				res, err = c.Admin().ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: id, Operator: op})
				return err
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(&releaseResult{
				SessionID:      id,
				ReleasedBlocks: res.GetReleasedBlocks(),
				Operator:       op,
			})
		},
	}
}

// operator names who runs pegactl, as user@host, for pegad's audit log.
func operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = fmt.Sprintf("uid%d", os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

type releaseResult struct {
	SessionID      string `json:"session_id"`
	ReleasedBlocks uint32 `json:"released_blocks"`
	Operator       string `json:"operator"`
}

func (r *releaseResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "SESSION\tRELEASED BLOCKS\tOPERATOR")
	_, err := fmt.Fprintf(w, "%s\t%d\t%s\n", r.SessionID, r.ReleasedBlocks, r.Operator)
	return err
}
