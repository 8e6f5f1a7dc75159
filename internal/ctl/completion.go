package ctl

import (
	"github.com/spf13/cobra"
)

// NewCompletionCommand prints a shell completion script for pegactl
// (`make install` puts them where bash, zsh and fish look).
func NewCompletionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script (bash, zsh or fish)",
		Long: `Print a completion script for pegactl on stdout.

  bash: pegactl completion bash > /usr/share/bash-completion/completions/pegactl
  zsh:  pegactl completion zsh > "${fpath[1]}/_pegactl"
  fish: pegactl completion fish > ~/.config/fish/completions/pegactl.fish

make install installs all three under PREFIX.`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("%s needs one shell: bash, zsh or fish", cmd.CommandPath())
			}
			return cobra.OnlyValidArgs(cmd, args)
		},
		// Completion needs no daemon and no global flag checks.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			default:
				return root.GenFishCompletion(out, true)
			}
		},
	}
}
