// Package version holds pegad's build identity, stamped at link time:
//
//	go build -ldflags "-X github.com/pegaflow/pegad/internal/version.Version=v0.1.0 \
//	  -X github.com/pegaflow/pegad/internal/version.Commit=$(git rev-parse --short HEAD)"
//
// It must never depend on any other pegad package.
package version

import (
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X; the defaults describe an unstamped build.
var (
	Version = "dev"
	Commit  = ""
)

// GoVersion is the toolchain the binary was built with.
func GoVersion() string { return runtime.Version() }

// CommitOrVCS is Commit, or the VCS revision Go embedded when the binary was
// built from a checkout without -ldflags (go build / go run), or "unknown".
func CommitOrVCS() string {
	if Commit != "" {
		return Commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if dirty {
				rev += "-dirty"
			}
			return rev
		}
	}
	return "unknown"
}

// String is the one-line identity printed by `pegad version`.
func String() string {
	return "pegad " + Version + " (commit " + CommitOrVCS() + ", " + GoVersion() + ")"
}
