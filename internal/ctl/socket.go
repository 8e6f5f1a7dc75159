package ctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/pegaflow/pegad/internal/localsock"
)

// socketDefaults are pegactl's own default socket (the daemon's rule for
// this user) and the node's system socket; tests replace them.
var socketDefaults = func() (own, system string) { return localsock.Default(), localsock.SystemSocket }

// resolveSocket picks the socket when neither --socket nor PEGACTL_SOCKET
// named one: the user's own default, unless it is absent and the system
// socket is there (or cannot even be looked at: then the permission error
// that follows says how to get access). An operator in pegad's group thus
// reaches the node's daemon without flags.
func resolveSocket(own, system string) string {
	if own == system {
		return own
	}
	if _, err := os.Lstat(own); !errors.Is(err, fs.ErrNotExist) {
		return own
	}
	if _, err := os.Lstat(system); errors.Is(err, fs.ErrNotExist) {
		return own
	}
	return system
}

// permissionError: the socket exists but this user may not connect to it.
type permissionError struct {
	socket string
	group  string // the socket's (or its directory's) group; "" if unknown
}

func (e *permissionError) Error() string {
	if e.group == "" {
		return fmt.Sprintf("permission denied on pegad's socket %s: ask an admin for access to it, or run pegactl as root", e.socket)
	}
	return fmt.Sprintf("permission denied on pegad's socket %s: join its group %q (sudo usermod -aG %s $USER, then log in again), or run pegactl as root",
		e.socket, e.group, e.group)
}

// socketGroup names the group that grants access to path: the socket's,
// else (when even that cannot be read) its directory's.
func socketGroup(path string) string {
	for _, p := range []string{path, filepath.Dir(path)} {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return ""
		}
		gid := strconv.FormatUint(uint64(st.Gid), 10)
		if g, err := user.LookupGroupId(gid); err == nil {
			return g.Name
		}
		return gid
	}
	return ""
}
