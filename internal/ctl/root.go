// Package ctl implements pegactl, the operator's command-line client of a
// local pegad: it owns the command tree, flag parsing, the exit codes
// (exit.go) and the table and JSON output shapes documented in
// docs/pegactl.md. It reaches the local pegad only through the public
// client (github.com/pegaflow/pegad/client, client.go), and a peer's port
// only through peerClient (peer.go).
//
// It must never touch daemon state except through those RPCs, and never
// print anything but the command's result on stdout: errors are exactly one
// line, "Error: <message>", on stderr, with a typed exit code (see exit.go).
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// EnvSocket overrides the default socket path; --socket overrides it.
const EnvSocket = "PEGACTL_SOCKET"

// defaultTimeout bounds one command's RPCs, streaming puts and gets
// included; prefetch passes it to the daemon as the fetch timeout.
const defaultTimeout = 30 * time.Second

// globalFlags are the root's persistent flags, shared by every command.
type globalFlags struct {
	socket  string
	output  string
	timeout time.Duration
}

// Streams are where a command reads and writes; tests substitute buffers.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// Main runs pegactl with args (without the program name) and returns the
// process exit code. Errors have been printed to streams.Err already.
func Main(ctx context.Context, args []string, streams Streams) int {
	root := NewRootCommand(streams)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	code, msg := classify(err)
	fmt.Fprintf(streams.Err, "Error: %s\n", oneLine(msg))
	return code
}

// NewRootCommand builds the pegactl command tree writing to streams.
func NewRootCommand(streams Streams) *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "pegactl",
		Short: "Inspect and operate a local pegad",
		Long: `pegactl talks to the pegad on this node over its unix socket.

Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 pegad unavailable,
5 permission denied on the socket, or a peer refused a certificate.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noSubcommand,
		RunE:          needSubcommand,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("socket") && os.Getenv(EnvSocket) == "" {
				g.socket = resolveSocket(socketDefaults())
			}
			return g.validate()
		},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.Err)
	root.CompletionOptions.DisableDefaultCmd = true

	// The daemon's own default rule, so both agree without flags.
	socket, system := socketDefaults()
	if s := os.Getenv(EnvSocket); s != "" {
		socket = s
	}
	pf := root.PersistentFlags()
	usage := "pegad's unix socket (env " + EnvSocket + ")"
	if socket != system {
		usage += "; when the default is absent: " + system
	}
	pf.StringVar(&g.socket, "socket", socket, usage)
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table|json")
	pf.DurationVar(&g.timeout, "timeout", defaultTimeout, "deadline of the whole command")

	root.AddCommand(
		NewBlocksCommand(g),
		NewPrefetchCommand(g),
		NewBenchCommand(g),
		NewSessionsCommand(g),
		NewLocksCommand(g),
		NewConnsCommand(g),
		NewStatsCommand(g),
		NewVersionCommand(g),
		NewCompletionCommand(),
		NewNodesCommand(g),
	)
	markRunErrors(root)
	return root
}

func (g *globalFlags) validate() error {
	switch g.output {
	case "table", "json":
	default:
		return usageErrorf("invalid --output %q: want table or json", g.output)
	}
	if g.timeout <= 0 {
		return usageErrorf("invalid --timeout %s: must be positive", g.timeout)
	}
	if g.socket == "" {
		return usageErrorf("empty --socket")
	}
	// A relative --socket (or PEGACTL_SOCKET) is resolved against the
	// working directory, as pegad resolves its own, so that errors name
	// the file that was tried.
	abs, err := filepath.Abs(g.socket)
	if err != nil {
		return usageErrorf("--socket %s: %v", g.socket, err)
	}
	g.socket = abs
	return nil
}

// newGroupCommand is a command that only holds subcommands. Run bare, or
// with an unknown subcommand, it is a usage error.
func newGroupCommand(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noSubcommand,
		RunE:  needSubcommand,
	}
}

// needSubcommand is a group's RunE. A bare group does nothing, so it must
// not exit 0: a script that ran `pegactl conns` for `conns list` would
// read success from a command that listed nothing. It prints the group's
// help where --help prints it (stdout), then fails with exit 2 and the
// one Error line naming the subcommands.
func needSubcommand(cmd *cobra.Command, _ []string) error {
	if err := cmd.Help(); err != nil {
		return err
	}
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return usageErrorf("%q needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
}

func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

// markRunErrors tags every error a command's RunE returns, so that Main can
// tell them from cobra's own errors (bad flags, missing required flags,
// wrong arguments), which are all usage errors.
func markRunErrors(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if err := run(cmd, args); err != nil {
				return &runError{err: err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markRunErrors(sub)
	}
}

type runError struct{ err error }

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

func isRunError(err error) bool {
	var r *runError
	return errors.As(err, &r)
}

// oneLine keeps the error to the single line the contract promises.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
