// Package cli is pegad's command line: the cobra root with `serve` (the
// default when no subcommand is given) and `version`. It only turns argv,
// environment and config file into a config.Config and hands it to
// daemon.Run; it must never wire components itself.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/version"
)

// NewRootCommand returns `pegad`. Bare `pegad [flags]` runs serve.
func NewRootCommand() *cobra.Command {
	serve := newServeCommand()
	root := &cobra.Command{
		Use:   "pegad",
		Short: "KV-cache node daemon: holds blocks in pinned memory and serves them to peers over RDMA",
		Long: `pegad keeps LLM KV-cache blocks in a pinned host-memory pool, serves them to
peers by one-sided RDMA READs (holder) and fetches blocks from peers (requester).

Without a subcommand, pegad runs "serve". Every serve flag is also a key of the
YAML config (--config) and a PEGAD_<NAME> environment variable; precedence is
flag > environment > config file > default.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          serve.RunE,
	}
	// The root accepts serve's flags so that `pegad --pool-size 1GiB` works.
	root.Flags().AddFlagSet(serve.Flags())
	root.AddCommand(serve, newVersionCommand())
	// Bad flags are configuration errors too (inherited by subcommands).
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &configError{err} })
	return root
}

func newServeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon (the default command)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cmd.Flags(), config.Default())
			if err != nil {
				return &configError{err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// After the first signal, restore the default action: a second
			// SIGTERM/SIGINT kills a shutdown that hangs.
			context.AfterFunc(ctx, stop)
			return daemon.Run(ctx, cfg)
		},
	}
	config.RegisterFlags(cmd.Flags(), config.Default())
	return cmd
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}

// Exit statuses of pegad (docs/config.md "Exit status").
const (
	ExitError = 1
	// ExitConfig: pegad refused its configuration (a flag, PEGAD_*
	// variable, config file or value). Restarting cannot help, so a unit
	// sets RestartPreventExitStatus=78 (EX_CONFIG of sysexits.h).
	ExitConfig = 78
)

// configError marks an error as the configuration's fault.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// exitCode is the process exit status for err (nil: 0).
func exitCode(err error) int {
	var ce *configError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce), errors.Is(err, daemon.ErrLoopbackAdvertise):
		return ExitConfig
	}
	return ExitError
}

// Main runs the command line and returns the process exit status.
func Main() int {
	err := NewRootCommand().ExecuteContext(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "pegad: error:", err)
	}
	return exitCode(err)
}
