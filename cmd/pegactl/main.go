// Command pegactl inspects and operates the pegad on this node; see
// docs/pegactl.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pegaflow/pegad/internal/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Main(ctx, os.Args[1:], ctl.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
