package ctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	pegaclient "github.com/pegaflow/pegad/client"
)

// addWatchFlag adds --watch to a list or stats command.
func addWatchFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVarP(d, "watch", "w", 0, "re-run every DURATION (e.g. 2s) until interrupted; 0: once")
}

// isTerminal: w is a terminal (progress lines and screen clearing only
// go there, never into a pipe or file).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// repeat prints fetch's result once, or, with interval > 0, every
// interval until the command's context ends (Ctrl-C: exit 0). Each round
// has its own --timeout. On a terminal a table replaces the previous one;
// elsewhere rounds follow each other, each under an "Every ..." header
// (tables) or as one JSON document each.
func (g *globalFlags) repeat(cmd *cobra.Command, interval time.Duration, fetch func(ctx context.Context, c *pegaclient.Client) (result, error)) error {
	if interval < 0 {
		return usageErrorf("invalid --watch %s: must not be negative", interval)
	}
	out := cmd.OutOrStdout()
	if interval == 0 {
		var res result
		err := g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
			var err error
			res, err = fetch(ctx, c)
			return err
		})
		if err != nil {
			return err
		}
		return g.printer(out).print(res)
	}
	c, err := g.dial(cmd.Context(), false)
	if err != nil {
		return err
	}
	defer c.Close()
	tty := isTerminal(out)
	parent := cmd.Context()
	for {
		ctx, cancel := context.WithTimeout(parent, g.timeout)
		res, err := fetch(ctx, c)
		cancel()
		if ended(parent) {
			return nil // interrupted: the normal end of a watch
		}
		if err != nil {
			return err
		}
		if g.output == "table" {
			if tty {
				fmt.Fprint(out, "\033[H\033[2J")
			}
			fmt.Fprintf(out, "Every %s: %s\t%s\n\n", interval, cmd.CommandPath(), time.Now().Format("15:04:05"))
		}
		if err := g.printer(out).print(res); err != nil {
			return err
		}
		if g.output == "table" && !tty {
			fmt.Fprintln(out)
		}
		t := time.NewTimer(interval)
		select {
		case <-parent.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// ended reports whether ctx, the watch's, is over: cancelled, or past its
// deadline. The deadline is asked too because a call made just after it
// fails at once (gRPC compares it with the clock) while a loaded runtime
// may not have fired ctx's timer yet, so ctx.Err() is still nil.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// sortKeys are the --sort keys of one list: each compares two rows.
type sortKeys[T any] map[string]func(a, b T) int

// addSortFlag adds --sort with the keys' names in its help.
func addSortFlag[T any](cmd *cobra.Command, spec *string, keys sortKeys[T]) {
	cmd.Flags().StringVar(spec, "sort", "", "sort rows by KEY ("+strings.Join(keys.names(), ", ")+"); -KEY sorts descending")
}

func (k sortKeys[T]) names() []string {
	out := make([]string, 0, len(k))
	for n := range k {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// check validates spec before anything is fetched.
func (k sortKeys[T]) check(spec string) error {
	if spec == "" {
		return nil
	}
	if _, ok := k[strings.TrimPrefix(spec, "-")]; !ok {
		return usageErrorf("invalid --sort %q: want one of %s (prefix - for descending)", spec, strings.Join(k.names(), ", "))
	}
	return nil
}

// apply sorts rows by spec (stable: equal rows keep pegad's order).
func (k sortKeys[T]) apply(rows []T, spec string) {
	if spec == "" {
		return
	}
	desc := strings.HasPrefix(spec, "-")
	f := k[strings.TrimPrefix(spec, "-")]
	if f == nil {
		return
	}
	slices.SortStableFunc(rows, func(a, b T) int {
		if desc {
			return f(b, a)
		}
		return f(a, b)
	})
}

// by builds a comparison from a field.
func by[T any, V cmp.Ordered](field func(T) V) func(a, b T) int {
	return func(a, b T) int { return cmp.Compare(field(a), field(b)) }
}
