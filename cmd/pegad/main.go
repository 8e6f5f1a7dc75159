// Command pegad is the KV-cache node daemon. See internal/daemon/cli.
package main

import (
	"os"

	"github.com/pegaflow/pegad/internal/daemon/cli"
)

func main() { os.Exit(cli.Main()) }
