package ctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/version"
)

// NewVersionCommand prints pegactl's version and the daemon's.
func NewVersionCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show pegactl's version and the version of the pegad it talks to",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := &versionResult{Client: clientVersion()}
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				res, err := c.Admin().Version(ctx, &pegadv1.VersionRequest{})
				if err != nil {
					return err
				}
				out.Server = &serverVersionJSON{
					Version:        res.GetVersion(),
					Commit:         res.GetCommit(),
					GoVersion:      res.GetGoVersion(),
					Transport:      res.GetTransport(),
					VerbsAvailable: res.GetVerbsAvailable(),
				}
				return nil
			})
			// The client's version is worth printing even when pegad is
			// unreachable; the error still decides the exit code.
			if perr := g.printer(cmd.OutOrStdout()).print(out); perr != nil && err == nil {
				err = perr
			}
			return err
		},
	}
}

type clientVersionJSON struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
}

type serverVersionJSON struct {
	Version        string `json:"version"`
	Commit         string `json:"commit"`
	GoVersion      string `json:"go_version"`
	Transport      string `json:"transport"`
	VerbsAvailable bool   `json:"verbs_available"`
}

type versionResult struct {
	Client clientVersionJSON `json:"client"`
	// Null when pegad could not be asked.
	Server *serverVersionJSON `json:"server"`
}

// clientVersion is pegactl's build identity, stamped like pegad's
// (internal/version).
func clientVersion() clientVersionJSON {
	return clientVersionJSON{Version: version.Version, Commit: version.CommitOrVCS(), GoVersion: version.GoVersion()}
}

func (r *versionResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "\tVERSION\tCOMMIT\tGO\tTRANSPORT\tVERBS")
	fmt.Fprintf(w, "client\t%s\t%s\t%s\t-\t-\n", r.Client.Version, dash(r.Client.Commit), r.Client.GoVersion)
	if s := r.Server; s != nil {
		verbs := "unavailable"
		if s.VerbsAvailable {
			verbs = "available"
		}
		fmt.Fprintf(w, "server\t%s\t%s\t%s\t%s\t%s\n", s.Version, dash(s.Commit), s.GoVersion, dash(s.Transport), verbs)
	} else {
		fmt.Fprintln(w, "server\t-\t-\t-\t-\t-")
	}
	return nil
}
