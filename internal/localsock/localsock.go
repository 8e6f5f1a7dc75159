// Package localsock owns where pegad's local API socket lives when no flag
// names it: the one rule pegad (through internal/config) and pegactl share,
// so both agree without flags. It computes paths only: it must never open,
// create or check a socket, and never import a config or metrics library
// (pegactl depends on it).
package localsock

import (
	"os"
	"path/filepath"
	"strconv"
)

// SystemSocket is the socket of a pegad run as a system service (root,
// systemd); pegactl run by another user falls back to it.
const SystemSocket = "/run/pegad/pegad.sock"

// Default is the default --socket: /run/pegad/pegad.sock for root
// (systemd's RuntimeDirectory=pegad creates /run/pegad; pegad creates it
// otherwise), else $XDG_RUNTIME_DIR/pegad.sock, else /tmp/pegad-$UID.sock.
func Default() string {
	if os.Geteuid() == 0 {
		return SystemSocket
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "pegad.sock")
	}
	return filepath.Join(os.TempDir(), "pegad-"+strconv.Itoa(os.Getuid())+".sock")
}
