package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pegaflow/pegad/internal/peertls"
)

// load parses args with a fresh flag set over Default() and loads, with env
// set for the test and the file (when non-empty) written to a temp dir and
// passed as --config.
func load(t *testing.T, args []string, env map[string]string, file string) (Config, error) {
	t.Helper()
	// Clear every PEGAD_* var the machine may have, then set the case's.
	for _, kv := range os.Environ() {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix+"_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
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
		return Config{}, err
	}
	return Load(fs, Default())
}

func TestDefaults(t *testing.T) {
	c, err := load(t, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := Config{
		NodeID: host, Listen: "127.0.0.1:50055", Socket: DefaultSocket(),
		MetricsListen: "127.0.0.1:9464", PoolSize: 256 << 20, PoolHugePages: "none", Eviction: "adaptive", Transport: "auto", NICs: "1",
		QPsPerPeer: 2, RelaxedOrdering: true, GIDIndex: -1, QPTimeout: -1, QPRetryCount: 7, CQBusyPoll: 20 * time.Microsecond, TCPDataListen: "", TCPQPNStart: 0x100, RDMAIdleTimeout: time.Minute,
		LockTimeout: 120 * time.Second, GCInterval: time.Second, ShutdownTimeout: 10 * time.Second,
		LogLevel: "info", LogFormat: "auto", ClusterTTL: 10 * time.Second, MaxSessionsPerPeer: DefaultMaxSessionsPerPeer,
		KVEventsTopic: "kv@{node}@{model}",
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if got := c.EffectiveLockMaxLifetime(); got != 1200*time.Second {
		t.Fatalf("default max lifetime = %s, want 20m", got)
	}
}

func TestPrecedence(t *testing.T) {
	const file = "pool-size: 64MiB\nlock-timeout: 30s\nqps-per-peer: 3\nnode-id: from-file\n"
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		file  string
		check func(c Config) string
	}{
		{"file over default", nil, nil, file, func(c Config) string {
			if c.PoolSize != 64<<20 || c.LockTimeout != 30*time.Second || c.QPsPerPeer != 3 || c.NodeID != "from-file" {
				return "file values not applied"
			}
			if c.Listen != "127.0.0.1:50055" {
				return "unset key lost its default"
			}
			return ""
		}},
		{"env over file", nil, map[string]string{"PEGAD_POOL_SIZE": "32MiB", "PEGAD_LOCK_TIMEOUT": "5s"}, file, func(c Config) string {
			if c.PoolSize != 32<<20 || c.LockTimeout != 5*time.Second {
				return "env did not win over file"
			}
			if c.QPsPerPeer != 3 {
				return "file key without env lost"
			}
			return ""
		}},
		{"flag over env over file", []string{"--pool-size=16MiB", "--qps-per-peer=5"},
			map[string]string{"PEGAD_POOL_SIZE": "32MiB", "PEGAD_QPS_PER_PEER": "4"}, file, func(c Config) string {
				if c.PoolSize != 16<<20 || c.QPsPerPeer != 5 {
					return "flag did not win"
				}
				if c.LockTimeout != 30*time.Second {
					return "file value lost"
				}
				return ""
			}},
		{"env over default", nil, map[string]string{"PEGAD_TRANSPORT": "tcp", "PEGAD_PEER_REFLECTION": "true",
			"PEGAD_TCP_QPN_START": "0x200", "PEGAD_METRICS_LISTEN": ""}, "", func(c Config) string {
			if c.Transport != "tcp" || !c.PeerReflection || c.TCPQPNStart != 0x200 {
				return "env not applied"
			}
			return ""
		}},
		{"hex and decimal qpn start", []string{"--tcp-qpn-start=4096"}, nil, "", func(c Config) string {
			if c.TCPQPNStart != 4096 {
				return "decimal qpn start"
			}
			return ""
		}},
		{"yaml ints and sizes", nil, nil, "pool-size: 33554432\ntcp-qpn-start: 0x300\nnics: mlx5_0,mlx5_1\n", func(c Config) string {
			if c.PoolSize != 32<<20 || c.TCPQPNStart != 0x300 {
				return "yaml numbers"
			}
			n, names, _ := c.NICSpec()
			if n != 2 || names[1] != "mlx5_1" || c.NICRails() != nil {
				return "nic names"
			}
			return ""
		}},
		{"nics rail mapping", []string{"--nics=rail0=mlx5_0, rail1 = mlx5_3"}, nil, "", func(c Config) string {
			n, names, _ := c.NICSpec()
			if rails := c.NICRails(); n != 2 || !slices.Equal(names, []string{"mlx5_0", "mlx5_3"}) ||
				!slices.Equal(rails, []string{"rail0", "rail1"}) {
				return fmt.Sprintf("nics %d %v rails %v", n, names, c.NICRails())
			}
			return ""
		}},
		{"explicit max lifetime", []string{"--lock-timeout=1s", "--lock-max-lifetime=3s"}, nil, "", func(c Config) string {
			if c.EffectiveLockMaxLifetime() != 3*time.Second {
				return "max lifetime"
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.args, tc.env, tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(c); msg != "" {
				t.Fatalf("%s: %+v", msg, c)
			}
		})
	}
}

func TestConfigFileFromEnv(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("gc-interval: 250ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, nil, map[string]string{"PEGAD_CONFIG": p}, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.GCInterval != 250*time.Millisecond || c.File != p {
		t.Fatalf("PEGAD_CONFIG not read: %+v", c)
	}
}

func TestInvalid(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		wantErr []string // substrings, all required
	}{
		{"unknown file key", nil, nil, "pool-size: 32MiB\npoolsize: 1\n", []string{"unknown key", "poolsize"}},
		{"unknown nested key", nil, nil, "pool:\n  size: 1\n", []string{"unknown key", "pool.size"}},
		{"config key in file", nil, nil, "config: /etc/x\n", []string{"unknown key", "config"}},
		{"typo of a key", nil, nil, "lock-timout: 5s\n", []string{"lock-timout: unknown key (did you mean lock-timeout?)"}},
		{"two typos", nil, nil, "lock-timout: 5s\nlog-levl: debug\n", []string{
			"lock-timout: unknown key (did you mean lock-timeout?); log-levl: unknown key (did you mean log-level?)"}},
		{"key far from any", nil, nil, "zzzzzzzz: 1\n", []string{"zzzzzzzz: unknown key (valid keys: ", "pool-size"}},
		{"missing file", []string{"--config=/nonexistent/pegad.yaml"}, nil, "", []string{"/nonexistent/pegad.yaml"}},
		{"malformed yaml", nil, nil, "pool-size: [1\n", []string{"pegad.yaml"}},
		{"bad size flag", []string{"--pool-size=lots"}, nil, "", []string{"pool-size", "lots"}},
		{"bad size unit", nil, map[string]string{"PEGAD_POOL_SIZE": "10XB"}, "", []string{"pool-size", "unknown unit"}},
		{"negative size", nil, nil, "pool-size: -5\n", []string{"pool-size"}},
		{"pool too small", []string{"--pool-size=512KiB"}, nil, "", []string{"pool-size", "minimum"}},
		{"bad duration env", nil, map[string]string{"PEGAD_LOCK_TIMEOUT": "soon"}, "", []string{"lock-timeout", "soon"}},
		{"bare number duration", nil, nil, "lock-timeout: 120\n", []string{"lock-timeout", "unit"}},
		{"zero lock timeout", []string{"--lock-timeout=0s"}, nil, "", []string{"lock-timeout", "positive"}},
		{"zero gc interval", []string{"--gc-interval=0s"}, nil, "", []string{"gc-interval", "positive"}},
		{"negative gc interval", nil, nil, "gc-interval: -1s\n", []string{"gc-interval"}},
		{"lifetime below timeout", []string{"--lock-timeout=10s", "--lock-max-lifetime=5s"}, nil, "", []string{"lock-max-lifetime"}},
		{"transport", []string{"--transport=udp"}, nil, "", []string{"transport", "udp"}},
		{"qps zero", []string{"--qps-per-peer=0"}, nil, "", []string{"qps-per-peer"}},
		{"qps not a number env", nil, map[string]string{"PEGAD_QPS_PER_PEER": "two"}, "", []string{"qps-per-peer"}},
		{"nics zero", []string{"--nics=0"}, nil, "", []string{"nics"}},
		{"nic-numa no node", []string{"--nic-numa=rxe0"}, nil, "", []string{"nic-numa", "NIC=NODE"}},
		{"nic-numa negative node", []string{"--nic-numa=rxe0=-1"}, nil, "", []string{"nic-numa", "0..1023"}},
		{"nic-numa node not a number env", nil, map[string]string{"PEGAD_NIC_NUMA": "rxe0=one"}, "", []string{"nic-numa", "one"}},
		{"nic-numa twice", nil, nil, "nic-numa: rxe0=0,rxe0=1\n", []string{"nic-numa", "twice"}},
		{"nics empty name", []string{"--nics=mlx5_0,,mlx5_1"}, nil, "", []string{"nics", "empty"}},
		{"nics duplicate", []string{"--nics=a,a"}, nil, "", []string{"nics", "twice"}},
		{"nics rails mixed with bare names", []string{"--nics=r0=mlx5_0,mlx5_1"}, nil, "", []string{"nics", "mixes"}},
		{"nics bare name then rails", []string{"--nics=mlx5_0,r1=mlx5_1"}, nil, "", []string{"nics", "mixes"}},
		{"nics empty rail", []string{"--nics==mlx5_0"}, nil, "", []string{"nics", "empty rail"}},
		{"nics rail twice", []string{"--nics=r0=mlx5_0,r0=mlx5_1"}, nil, "", []string{"nics", "rail", "twice"}},
		{"nics rail without device", []string{"--nics=r0="}, nil, "", []string{"nics", "empty device"}},
		{"listen no port", []string{"--listen=localhost"}, nil, "", []string{"listen"}},
		{"debug listen on all interfaces", []string{"--debug-listen=0.0.0.0:6060"}, nil, "", []string{"debug-listen", "loopback"}},
		{"debug listen on a hostname", []string{"--debug-listen=node1:6060"}, nil, "", []string{"debug-listen", "loopback"}},
		{"debug listen no port", []string{"--debug-listen=127.0.0.1"}, nil, "", []string{"debug-listen"}},
		{"advertise port zero", []string{"--advertise=10.0.0.1:0"}, nil, "", []string{"advertise"}},
		{"qpn start zero", []string{"--tcp-qpn-start=0"}, nil, "", []string{"tcp-qpn-start"}},
		{"qp timeout zero (infinite)", []string{"--qp-timeout=0"}, nil, "", []string{"qp-timeout", "1..31"}},
		{"qp timeout too large", []string{"--qp-timeout=32"}, nil, "", []string{"qp-timeout"}},
		{"qp retry count too large", []string{"--qp-retry-count=8"}, nil, "", []string{"qp-retry-count", "0..7"}},
		{"cq busy poll negative", []string{"--cq-busy-poll=-1us"}, nil, "", []string{"cq-busy-poll"}},
		{"cq busy poll too long", []string{"--cq-busy-poll=1s"}, nil, "", []string{"cq-busy-poll"}},
		{"qpn start too big", []string{"--tcp-qpn-start=0x1000000"}, nil, "", []string{"tcp-qpn-start"}},
		{"log level", []string{"--log-level=loud"}, nil, "", []string{"log-level", "loud"}},
		{"log format", nil, nil, "log-format: xml\n", []string{"log-format", "xml"}},
		{"empty node id", []string{"--node-id="}, nil, "", []string{"node-id"}},
		{"empty socket", nil, nil, "socket: \"\"\n", []string{"socket"}},
		{"cluster redis scheme", []string{"--cluster-redis=http://r:6379"}, nil, "", []string{"cluster-redis", "redis://"}},
		{"cluster redis one bad of two", nil, map[string]string{"PEGAD_CLUSTER_REDIS": "redis://a:1,b:2"}, "", []string{"cluster-redis", "b:2"}},
		{"cluster redis no host", nil, nil, "cluster-redis: redis://\n", []string{"cluster-redis", "no host"}},
		{"ssd path relative", []string{"--ssd-path=ssd", "--ssd-size=1GiB"}, nil, "", []string{"ssd-path", "absolute"}},
		{"ssd path twice", []string{"--ssd-path=/a,/a/", "--ssd-size=1GiB"}, nil, "", []string{"ssd-path", "twice"}},
		{"ssd path empty entry", []string{"--ssd-path=/a,", "--ssd-size=1GiB"}, nil, "", []string{"ssd-path", "empty entry"}},
		{"ssd size missing", []string{"--ssd-path=/a"}, nil, "", []string{"ssd-size", "minimum"}},
		{"cluster ttl tiny", []string{"--cluster-ttl=1ms"}, nil, "", []string{"cluster-ttl"}},
		{"kv events endpoint without scheme", []string{"--kv-events-endpoint=127.0.0.1:5557"}, nil, "", []string{"kv-events-endpoint", "tcp://"}},
		{"kv events endpoint udp", []string{"--kv-events-endpoint=udp://*:5557"}, nil, "", []string{"kv-events-endpoint"}},
		{"kv events bad port", nil, map[string]string{"PEGAD_KV_EVENTS_ENDPOINT": "tcp://*:99999"}, "", []string{"kv-events-endpoint", "port"}},
		{"kv events replay alone", []string{"--kv-events-replay-endpoint=tcp://*:5558"}, nil, "", []string{"kv-events-replay-endpoint", "needs kv-events-endpoint"}},
		{"kv events empty ipc", nil, nil, "kv-events-endpoint: ipc://\n", []string{"kv-events-endpoint", "ipc"}},
		{"tls cert without key", []string{"--peer-tls-cert=a.pem", "--peer-tls-ca=ca.pem"}, nil, "", []string{"peer-tls-cert", "all three"}},
		{"allow without tls", []string{"--peer-allow=node-*"}, nil, "", []string{"peer-allow", "needs peer-tls"}},
		{"allow empty entry", nil, nil, "peer-tls-cert: a\npeer-tls-key: b\npeer-tls-ca: c\npeer-allow: a,,b\n", []string{"peer-allow", "empty entry"}},
		{"allow over peertls's cap", []string{"--peer-allow=" + strings.Repeat("n,", peertls.MaxAllowPatterns) + "n"}, nil,
			"peer-tls-cert: a\npeer-tls-key: b\npeer-tls-ca: c\n", []string{"peer-allow", "at most 1024"}},
		{"negative sessions per peer", []string{"--max-sessions-per-peer=-1"}, nil, "", []string{"max-sessions-per-peer"}},
		{"node pin cap over the pool", []string{"--pool-size=64MiB", "--max-pinned-bytes=1GiB"}, nil, "", []string{"max-pinned-bytes", "pool-size"}},
		{"peer pin cap over the pool", nil, map[string]string{"PEGAD_MAX_PINNED_BYTES_PER_PEER": "1GiB"}, "", []string{"max-pinned-bytes-per-peer"}},
		{"two errors at once", []string{"--transport=x", "--qps-per-peer=-1"}, nil, "", []string{"transport", "qps-per-peer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.args, tc.env, tc.file)
			if err == nil {
				t.Fatalf("want error containing %q, got config %+v", tc.wantErr, c)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n\n") {
				t.Fatalf("error should be compact: %q", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %q is not ErrInvalid", err)
			}
		})
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want ByteSize
		err  bool
	}{
		{"4096", 4096, false},
		{"16MiB", 16 << 20, false},
		{"1GiB", 1 << 30, false},
		{"512M", 512 << 20, false},
		{"512m", 512 << 20, false},
		{"2gb", 2 << 30, false},
		{"1.5GiB", 3 << 29, false},
		{" 8 KiB ", 8 << 10, false},
		{"1TiB", 1 << 40, false},
		{"", 0, true},
		{"MiB", 0, true},
		{"12XB", 0, true},
		{"-1", 0, true},
		{"99999999999999999999", 0, true},
		{"17000000TiB", 0, true},
		{"1.2.3M", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseByteSize(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestByteSizeString(t *testing.T) {
	for in, want := range map[ByteSize]string{256 << 20: "256MiB", 1 << 30: "1GiB", 1000: "1000", 3 << 10: "3KiB"} {
		if got := in.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", in, got, want)
		}
		back, err := ParseByteSize(want)
		if err != nil || back != in {
			t.Errorf("round trip %q = %d, %v", want, back, err)
		}
	}
}

func TestKeysMatchFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	RegisterFlags(fs, Default())
	for _, k := range Keys() {
		if fs.Lookup(k) == nil {
			t.Errorf("key %q has no flag", k)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == FlagConfig {
			return
		}
		found := false
		for _, k := range Keys() {
			found = found || k == f.Name
		}
		if !found {
			t.Errorf("flag --%s is not a config key", f.Name)
		}
	})
}

// TestExampleConfig keeps configs/pegad.yaml loadable and complete.
func TestExampleConfig(t *testing.T) {
	raw, err := os.ReadFile("../../configs/pegad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := load(t, nil, nil, string(raw))
	if err != nil {
		t.Fatalf("configs/pegad.yaml does not load: %v", err)
	}
	for _, k := range Keys() {
		if !strings.Contains(string(raw), "\n"+k+":") && !strings.Contains(string(raw), "\n# "+k+":") {
			t.Errorf("configs/pegad.yaml does not document key %q", k)
		}
	}
	_ = c
}

func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv([]string{"PEGAD_POOL_SIZE=1", "PEGAD_POOLSIZE=2", "PEGAD_CONFIG=/x", "PEGAD_TEST_VERBS_DEVICE=mlx5_0",
		"HOME=/root", "PEGAD_LOCK_TIMEOUT=1s", "PEGAD_LOG_LEVLE=debug", "PEGAD_TCP_QPN_START=1"})
	if strings.Join(got, ",") != "PEGAD_LOG_LEVLE,PEGAD_POOLSIZE" {
		t.Fatalf("UnknownEnv = %v", got)
	}
}

func TestSecurityKeys(t *testing.T) {
	c, err := load(t, []string{"--pool-size=64MiB"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.PeerTLS() || c.EffectiveMaxPinnedBytesPerPeer() != 32<<20 || c.EffectiveMaxPinnedBytes() != 48<<20 {
		t.Fatalf("defaults: tls %v, per peer %s, node %s", c.PeerTLS(), c.EffectiveMaxPinnedBytesPerPeer(), c.EffectiveMaxPinnedBytes())
	}
	c, err = load(t, []string{"--peer-tls-key=k.pem", "--max-pinned-bytes-per-peer=1MiB"},
		map[string]string{"PEGAD_PEER_TLS_CA": "ca.pem", "PEGAD_MAX_PINNED_BYTES": "2MiB"},
		"peer-tls-cert: c.pem\npeer-allow: \"spiffe://c/*, node-a\"\nsocket-group: pegad\nmax-sessions-per-peer: 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if !c.PeerTLS() || c.PeerAllow != "spiffe://c/*, node-a" || c.SocketGroup != "pegad" || c.MaxSessionsPerPeer != 0 ||
		c.EffectiveMaxPinnedBytesPerPeer() != 1<<20 || c.EffectiveMaxPinnedBytes() != 2<<20 {
		t.Fatalf("loaded %+v", c)
	}
}

func TestDebugListenLoopbackForms(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:6060", "127.0.0.2:0", "[::1]:6060", "localhost:6060"} {
		c, err := load(t, []string{"--debug-listen=" + addr}, nil, "")
		if err != nil || c.DebugListen != addr {
			t.Errorf("--debug-listen=%s: %v, %q", addr, err, c.DebugListen)
		}
	}
}

func TestNICNUMANodes(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]int
	}{
		{"", nil},
		{"  ", nil},
		{"rxe0=0", map[string]int{"rxe0": 0}},
		{"rxe0=0, rxe1 = 1", map[string]int{"rxe0": 0, "rxe1": 1}},
		{"mlx5_3=1023", map[string]int{"mlx5_3": 1023}},
	}
	for _, tc := range tests {
		c := Config{NICNUMA: tc.in}
		got, err := c.NICNUMANodes()
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if len(got) != len(tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%q = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %s = %d, want %d", tc.in, k, got[k], v)
			}
		}
	}
	for _, bad := range []string{"rxe0", "=0", "rxe0=", "rxe0=1024", "rxe0=x", "rxe0=0,rxe0=1", "rxe0=0,"} {
		if _, err := (&Config{NICNUMA: bad}).NICNUMANodes(); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
