package localsock

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestDefault(t *testing.T) {
	if os.Geteuid() == 0 {
		if got := Default(); got != SystemSocket {
			t.Fatalf("Default() as root = %q, want %q", got, SystemSocket)
		}
		return
	}
	tests := []struct{ name, xdg, want string }{
		{"runtime dir", "/run/user/1000", "/run/user/1000/pegad.sock"},
		{"no runtime dir", "", filepath.Join(os.TempDir(), "pegad-"+strconv.Itoa(os.Getuid())+".sock")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", tt.xdg)
			if got := Default(); got != tt.want {
				t.Fatalf("Default() = %q, want %q", got, tt.want)
			}
		})
	}
}
