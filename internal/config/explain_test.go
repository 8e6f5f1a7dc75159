package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// loadEffective is load (config_test.go) through LoadEffective.
func loadEffective(t *testing.T, args []string, env map[string]string, file string) Effective {
	t.Helper()
	if _, err := load(t, args, env, file); err != nil { // sets env, validates
		t.Fatal(err)
	}
	if file != "" {
		p := filepath.Join(t.TempDir(), "pegad.yaml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs, Default())
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	e, err := LoadEffective(fs, Default())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLoadEffectiveSources(t *testing.T) {
	e := loadEffective(t, []string{"--qps-per-peer=5", "--lock-timeout=7s"},
		map[string]string{"PEGAD_LOCK_TIMEOUT": "9s", "PEGAD_NICS": "3", "PEGAD_ADVERTISE": ""},
		"pool-size: 64MiB\nnics: \"2\"\nlock-timeout: 30s\n")
	want := map[string]Source{
		"pool-size":    SourceFile,    // file only
		"nics":         SourceEnv,     // env over file
		"lock-timeout": SourceFlag,    // flag over env over file
		"qps-per-peer": SourceFlag,    // flag only
		"listen":       SourceDefault, // nothing
		"advertise":    SourceDefault, // an empty variable is not a setting
	}
	for k, src := range want {
		if got := e.Sources[k]; got != src {
			t.Errorf("%s: source %q, want %q", k, got, src)
		}
	}
	if len(e.Sources) != len(Keys()) {
		t.Errorf("%d sources for %d keys", len(e.Sources), len(Keys()))
	}
	if e.Config.NICs != "3" || e.Config.PoolSize != 64<<20 || e.Config.QPsPerPeer != 5 {
		t.Errorf("values %+v", e.Config)
	}
}

// TestWriteYAMLRoundTrip: the printed configuration, used as a config
// file, gives the same configuration; every line names its source.
func TestWriteYAMLRoundTrip(t *testing.T) {
	e := loadEffective(t, []string{"--pool-size=48MiB", "--tcp-qpn-start=0x2a0", "--peer-reflection"},
		map[string]string{"PEGAD_LOCK_MAX_LIFETIME": "25m", "PEGAD_NODE_ID": "n: with colon"},
		"nics: mlx5_0,mlx5_1\ngc-interval: 250ms\nmetrics-listen: \"\"\n")
	var out bytes.Buffer
	if err := e.WriteYAML(&out); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.Contains(line, " # ") {
			t.Errorf("line without a source: %q", line)
		}
	}
	for _, want := range []string{"pool-size: 48MiB # flag --pool-size", "lock-max-lifetime: 25m0s # env PEGAD_LOCK_MAX_LIFETIME",
		"gc-interval: 250ms # file ", "listen: 127.0.0.1:50055 # default", "tcp-qpn-start: 0x2a0 # flag"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	back, err := load(t, nil, nil, out.String())
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, out.String())
	}
	back.File, e.Config.File = "", ""
	if !reflect.DeepEqual(back, e.Config) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, e.Config)
	}
}

func TestCheckFile(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string // "key: reason fragment", in order
	}{
		{"the shipped example", "", nil},
		{"empty file", "# nothing\n", nil},
		{"every kind of problem at once",
			"pool-size: lots\nlock-timout: 5s\nqps-per-peer: 0\ntransport: ib\nlisten: nope\nlock-timeout: 10\nfoo:\n  bar: 1\n",
			[]string{"foo.bar: unknown key", "listen: is not host:port", "lock-timeout: a bare number has no unit",
				"lock-timout: did you mean lock-timeout?", "pool-size: invalid size", "qps-per-peer: outside 1..64",
				"transport: is not one of"}},
		{"cross-key check", "lock-timeout: 60s\nlock-max-lifetime: 30s\n",
			[]string{"lock-max-lifetime: shorter than lock-timeout"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("..", "..", "configs", "pegad.yaml")
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "pegad.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			probs, err := CheckFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) != len(tc.want) {
				t.Fatalf("problems %v, want %d: %v", probs, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				key, frag, _ := strings.Cut(w, ": ")
				if probs[i].Key != key || !strings.Contains(probs[i].Reason, frag) {
					t.Errorf("problem %d = %q, want key %s with %q", i, probs[i], key, frag)
				}
			}
		})
	}
	if _, err := CheckFile(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("missing file: %v, want ErrUnreadable", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("pool-size: [unclosed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckFile(bad); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("unparsable file: %v, want ErrUnreadable", err)
	}
}
