// Package cli is pegad's command line: the cobra root with `serve` (the
// default when no subcommand is given), `config print|check` and `version`. It only turns argv,
// environment and config file into a config.Config and hands it to
// daemon.Run; it must never wire components itself.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
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
	root.AddCommand(serve, newVersionCommand(), newConfigCommand())
	// Bad flags are configuration errors too (inherited by subcommands).
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return config.Invalid(err) })
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
				return err // config.ErrInvalid: exit 78
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// After the first signal, restore the default action: a second
			// SIGTERM/SIGINT kills a shutdown that hangs.
			context.AfterFunc(ctx, stop)
			// SIGHUP reads the configuration again, flags as given.
			reload := func() (config.Config, error) { return config.Load(cmd.Flags(), config.Default()) }
			return daemon.Run(ctx, cfg, daemon.WithConfigReload(reload))
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

// exitCode is the process exit status for err (nil: 0): ExitConfig for
// every error that is the configuration's fault, whether Load or the
// daemon's start found it.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, config.ErrInvalid):
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

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show the effective configuration or check a config file",
		Args:  cobra.NoArgs,
		RunE:  needSubcommand,
	}
	print := &cobra.Command{
		Use:   "print [serve flags]",
		Short: "Print the effective configuration as YAML, each key with its source (default, file, env, flag)",
		Long: `Print the configuration "pegad serve" would run with, given the same flags,
PEGAD_* environment and config file (--config or PEGAD_CONFIG), as YAML. Each
key's line comment says where its value came from: default, file, env
(with the variable) or flag. The output is itself a valid config file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := config.LoadEffective(cmd.Flags(), config.Default())
			if err != nil {
				return err // config.ErrInvalid: exit 78, as serve would
			}
			return e.WriteYAML(cmd.OutOrStdout())
		},
	}
	config.RegisterFlags(print.Flags(), config.Default())
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a config file without starting; list every bad key with its reason (exit 1)",
		Long: `Validate FILE on its own (over the defaults; environment and flags are not
read) without starting anything. Every bad key is listed on stdout as
"KEY: REASON" (unknown keys, values that do not parse, values out of range);
the exit status is 1 when there is any, 0 when the file is valid.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			probs, err := config.CheckFile(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(probs) == 0 {
				_, err := fmt.Fprintf(out, "%s: ok\n", args[0])
				return err
			}
			for _, p := range probs {
				if _, err := fmt.Fprintf(out, "%s: %s\n", args[0], p); err != nil {
					return err
				}
			}
			return fmt.Errorf("%s: %d bad key(s)", args[0], len(probs))
		},
	}
	cmd.AddCommand(print, check)
	return cmd
}

// needSubcommand is the RunE of a command that only holds subcommands
// (bare pegad runs serve instead). Bare, it has done nothing, so it must
// not exit 0 (a script's `pegad config` would read as a passed check): it
// prints its help, then fails naming the subcommands.
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
	return fmt.Errorf("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
}
