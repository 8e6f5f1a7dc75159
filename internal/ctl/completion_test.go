package ctl

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCompletion: `pegactl completion SHELL` prints that shell's script
// without a daemon (the socket does not exist); other shells are usage
// errors.
func TestCompletion(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantOut  string // a line only that shell's script has
	}{
		{[]string{"completion", "bash"}, ExitOK, "# bash completion V2 for pegactl"},
		{[]string{"completion", "zsh"}, ExitOK, "#compdef pegactl"},
		{[]string{"completion", "fish"}, ExitOK, "# fish completion for pegactl"},
		{[]string{"completion", "powershell"}, ExitUsage, ""},
		{[]string{"completion"}, ExitUsage, ""},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"--socket", t.TempDir() + "/none.sock"}, tc.args...)
			code := Main(context.Background(), args, Streams{In: strings.NewReader(""), Out: &out, Err: &errOut})
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.wantCode, errOut.String())
			}
			if tc.wantOut != "" && !strings.Contains(out.String(), tc.wantOut) {
				t.Fatalf("stdout lacks %q:\n%.300s", tc.wantOut, out.String())
			}
			if tc.wantCode != ExitOK && out.Len() != 0 {
				t.Fatalf("a failed completion printed to stdout: %q", out.String())
			}
		})
	}
}
