// Package config owns pegad's settings: the `pegad serve` flags, their
// PEGAD_* environment variables and YAML config-file keys, their defaults
// and their validation. One key, one name everywhere: the flag --pool-size,
// the env PEGAD_POOL_SIZE and the file key pool-size are the same setting.
//
// Precedence, highest first: flag > environment > config file > default.
//
// It must never start anything or touch the network: it only turns inputs
// into a validated Config, so every bad input is a start-up error that
// names the offending key.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/localsock"
	"github.com/pegaflow/pegad/internal/peertls"
)

// ErrInvalid marks every error that is the configuration's fault: a bad
// flag, PEGAD_* variable, config file, key or value, or something a value
// names that cannot be used (TLS files, a socket group). Restarting cannot
// fix one, so pegad exits 78 (EX_CONFIG) on errors.Is(err, ErrInvalid).
var ErrInvalid = errors.New("invalid configuration")

// Invalid marks err as the configuration's fault (errors.Is(err,
// ErrInvalid)) without changing its text; nil stays nil.
func Invalid(err error) error {
	if err == nil || errors.Is(err, ErrInvalid) {
		return err
	}
	return &invalidError{err}
}

// NewInvalid is errors.New for a sentinel that is also ErrInvalid.
func NewInvalid(text string) error { return &invalidError{errors.New(text)} }

type invalidError struct{ err error }

func (e *invalidError) Error() string        { return e.err.Error() }
func (e *invalidError) Unwrap() error        { return e.err }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// EnvPrefix is the prefix of every environment variable (PEGAD_POOL_SIZE).
const EnvPrefix = "PEGAD"

// Transports accepted by the transport key.
const (
	TransportAuto  = "auto"
	TransportVerbs = "verbs"
	TransportTCP   = "tcp"
)

// Bounds enforced by Validate.
const (
	// MinSSDSize is the smallest --ssd-size: four segments of 1 MiB.
	MinSSDSize ByteSize = 4 << 20
	// MinPoolSize is the smallest pool pegad starts with: below it not even
	// one typical block plus a staging chunk fits.
	MinPoolSize   ByteSize = 1 << 20
	MaxQPsPerPeer          = limits.MaxQPsPerPeer
	MaxNICs                = limits.MaxNICs
	// MaxQPN is the largest 24-bit queue pair number; the tcp provider needs
	// room above the start for the QPs it allocates.
	MaxQPN = 0xFFFFFF
	// LifetimeFactor: lock-max-lifetime defaults to this many lock-timeouts.
	LifetimeFactor = 10
	// PeerShareDivisor: max-pinned-bytes-per-peer defaults to the pool
	// divided by it. Half: one peer can never pin what the others and
	// local puts need, yet one large prefetch (a third of a small pool,
	// as the e2e and reliability runs do) is not refused.
	PeerShareDivisor = 2
	// NodeEvictableDivisor: max-pinned-bytes defaults to the pool less
	// the pool divided by it (75%), which stays evictable for local puts.
	NodeEvictableDivisor = 4
	// DefaultMaxSessionsPerPeer is the default max-sessions-per-peer.
	DefaultMaxSessionsPerPeer = 1024
)

// Config is every setting of `pegad serve`. The mapstructure tag is the key
// in the YAML file, the flag name and (upper-cased, '-' → '_', PEGAD_
// prefixed) the environment variable.
type Config struct {
	// NodeID names this node in peers' logs and sessions. Default: hostname.
	NodeID string `mapstructure:"node-id"`
	// Listen is the peer gRPC address (PeerService).
	Listen string `mapstructure:"listen"`
	// Advertise is the address peers should use for this node; empty means
	// the bound --listen address.
	Advertise string `mapstructure:"advertise"`
	// Socket is the unix socket of the local API and admin API.
	Socket string `mapstructure:"socket"`
	// MetricsListen serves /metrics and /healthz over HTTP; "" disables.
	MetricsListen string `mapstructure:"metrics-listen"`
	// DebugListen serves net/http/pprof on a loopback address; "" (the
	// default) disables it. Loopback only: profiles show memory contents.
	DebugListen string `mapstructure:"debug-listen"`
	// PoolSize is the pinned host-memory pool.
	PoolSize ByteSize `mapstructure:"pool-size"`
	// PoolHugePages backs the pool with huge pages: none, thp, 2M or 1G
	// (2M/1G must be reserved: vm.nr_hugepages).
	PoolHugePages string `mapstructure:"pool-hugepages"`
	// NamespaceQuota bounds the pool bytes of namespaces: entries NS=SIZE
	// (repeatable flag; a YAML list, or a comma list in one string), NS a
	// namespace or a namespace prefix, the longest prefix winning
	// (NamespaceQuotas). SIGHUP reloads it.
	NamespaceQuota []string `mapstructure:"namespace-quota"`
	// Eviction names the policy that picks which unpinned blocks go when
	// the pool needs room: adaptive (W-TinyLFU, its window chosen by
	// shadow caches; the default), prefix (chain-aware recency and
	// frequency) or lru (internal/evict, docs/tiering.md).
	Eviction string `mapstructure:"eviction"`
	// Transport is auto, verbs or tcp.
	Transport string `mapstructure:"transport"`
	// NICs: tcp → how many software devices; verbs → a count (the first N
	// devices) or a comma-separated list of device names (mlx5_0,mlx5_1),
	// each optionally with its rail (rail0=mlx5_0,rail1=mlx5_3).
	NICs string `mapstructure:"nics"`
	// NICNUMA names the NUMA node of NICs whose sysfs has none (virtual
	// devices such as rxe, some VMs' NICs), as NIC=NODE[,NIC=NODE...]
	// (rxe0=0,rxe1=1); a named node replaces what sysfs says. Empty: sysfs
	// only.
	NICNUMA string `mapstructure:"nic-numa"`
	// QPsPerPeer is the number of RC queue pairs per peer per NIC.
	QPsPerPeer int `mapstructure:"qps-per-peer"`
	// RelaxedOrdering registers the pool with IBV_ACCESS_RELAXED_ORDERING
	// (verbs; ignored where the NIC or kernel lacks it).
	RelaxedOrdering bool `mapstructure:"relaxed-ordering"`
	// MemoryWindows registers the pool without remote read and serves each
	// transfer lock through type-2 memory windows over its blocks, so that
	// a peer can READ only what it locked (verbs; off, with a warning,
	// where a NIC lacks them).
	MemoryWindows bool `mapstructure:"memory-windows"`
	// GIDIndex forces the GID table entry of every verbs port; -1 chooses
	// (RoCE v2, a routable IPv4 address first).
	GIDIndex int `mapstructure:"gid-index"`
	// TrafficClass is the GRH traffic class of RoCE and GRH traffic: the
	// DSCP << 2 (e.g. 106 for DSCP 26, a common lossless class).
	TrafficClass int `mapstructure:"traffic-class"`
	// ServiceLevel is the InfiniBand SL (RoCE: the priority when the port
	// maps SL to PCP).
	ServiceLevel int `mapstructure:"service-level"`
	// PKeyIndex is the P_Key table entry of every QP (0: the default
	// partition).
	PKeyIndex int `mapstructure:"pkey-index"`
	// QPTimeout is the local ACK timeout exponent of every QP (4.096 us
	// × 2^QPTimeout per try); -1: the transport's default (verbs 14,
	// about 67 ms; tcp 17). With QPRetryCount it bounds how long a silent
	// peer takes to fail READs: (QPRetryCount+1) tries.
	QPTimeout int `mapstructure:"qp-timeout"`
	// QPRetryCount is the transport retry count of every QP (0..7).
	QPRetryCount int `mapstructure:"qp-retry-count"`
	// CQBusyPoll is how long a verbs CQ wait busy-polls before it blocks
	// on the completion channel (0: block at once).
	CQBusyPoll time.Duration `mapstructure:"cq-busy-poll"`
	// TCPDataListen is where the tcp provider's devices listen for READs.
	// Port 0: each device gets an ephemeral port; port P: device i uses P+i.
	// Empty: --listen's host (a wildcard included) with ephemeral ports, so
	// tcp works across hosts given only --listen and --advertise.
	TCPDataListen string `mapstructure:"tcp-data-listen"`
	// TCPQPNStart is the first QPN each tcp device allocates.
	TCPQPNStart uint32 `mapstructure:"tcp-qpn-start"`
	// RDMAIdleTimeout: a holder tears down a requester's connection once
	// the data connections it had opened (tcp transport) have all been
	// closed this long, or (verbs) once the requester has held no transfer
	// session and asked for none this long: that requester is gone
	// (killed, host down), or will handshake again when it next fetches.
	RDMAIdleTimeout time.Duration `mapstructure:"rdma-idle-timeout"`
	// LockTimeout is how long a transfer session pins its blocks unless
	// released or renewed.
	LockTimeout time.Duration `mapstructure:"lock-timeout"`
	// LockMaxLifetime caps a session's total life across renewals;
	// 0 means LifetimeFactor × LockTimeout.
	LockMaxLifetime time.Duration `mapstructure:"lock-max-lifetime"`
	// GCInterval is the lock sweeper's tick.
	GCInterval time.Duration `mapstructure:"gc-interval"`
	// ShutdownTimeout bounds graceful shutdown before in-flight RPCs are cut.
	ShutdownTimeout time.Duration `mapstructure:"shutdown-timeout"`
	// LogLevel: trace, debug, info, warn, error.
	LogLevel string `mapstructure:"log-level"`
	// LogFormat: json, console or auto (console on a terminal, else json).
	LogFormat string `mapstructure:"log-format"`
	// PeerReflection enables gRPC server reflection on the peer port.
	PeerReflection bool `mapstructure:"peer-reflection"`
	// ClusterRedis joins the cluster index (docs/cluster.md): one
	// redis:// or rediss:// URL, or a comma list of Redis Cluster seeds.
	// Empty: standalone, prefetch needs a peer.
	ClusterRedis string `mapstructure:"cluster-redis"`
	// ClusterTTL is how long this node's membership record lives unless
	// refreshed (every third of it).
	ClusterTTL time.Duration `mapstructure:"cluster-ttl"`
	// KVEventsEndpoint publishes vLLM KV events (docs/operations.md) on a
	// ZMQ PUB socket bound there: tcp://*:5557, tcp://HOST:PORT or
	// ipc://PATH. Empty: off.
	KVEventsEndpoint string `mapstructure:"kv-events-endpoint"`
	// KVEventsReplayEndpoint serves missed events (vLLM's replay ROUTER
	// socket); empty: none. Needs KVEventsEndpoint.
	KVEventsReplayEndpoint string `mapstructure:"kv-events-replay-endpoint"`
	// KVEventsTopic is the topic of each message, with {node}, {namespace},
	// {model} (the namespace before its first '@') and {rank} (after it)
	// expanded (llm-d reads kv@<pod>@<model>).
	KVEventsTopic string `mapstructure:"kv-events-topic"`

	// Peer-port protection (docs/security.md). All three TLS files, or
	// none: with them the peer port requires client certificates signed by
	// the CA and the requester presents the node certificate.
	PeerTLSCert string `mapstructure:"peer-tls-cert"`
	PeerTLSKey  string `mapstructure:"peer-tls-key"`
	PeerTLSCA   string `mapstructure:"peer-tls-ca"`
	// PeerAllow is a comma list of certificate identities (DNS or URI SANs,
	// '*' globs) admitted on the peer port; empty: every certificate of
	// the CA. Needs the TLS files.
	PeerAllow string `mapstructure:"peer-allow"`
	// MaxSessionsPerPeer bounds one peer's live transfer sessions; 0:
	// unlimited.
	MaxSessionsPerPeer int `mapstructure:"max-sessions-per-peer"`
	// MaxPinnedBytesPerPeer bounds what one peer's sessions pin; 0:
	// PoolSize / PeerShareDivisor.
	MaxPinnedBytesPerPeer ByteSize `mapstructure:"max-pinned-bytes-per-peer"`
	// MaxPinnedBytes bounds what all peers' sessions pin together, so local
	// puts can always evict; 0: 75% of PoolSize.
	MaxPinnedBytes ByteSize `mapstructure:"max-pinned-bytes"`
	// SocketGroup, when set, is the group that owns the local socket (its
	// members may use it: mode 0660).
	SocketGroup string `mapstructure:"socket-group"`

	// SSDPath is the SSD tier (docs/tiering.md): a comma list of
	// directories, one per device, each holding one log of SSDSize bytes.
	// Empty: no SSD tier (evicted blocks are gone).
	SSDPath string `mapstructure:"ssd-path"`
	// SSDSize is the log size per SSDPath entry (preallocated at start).
	SSDSize ByteSize `mapstructure:"ssd-size"`

	// File is the config file that was read ("" when none); not a key.
	File string `mapstructure:"-"`
}

// Default is the embedded configuration: a working single node on loopback.
func Default() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "pegad"
	}
	return Config{
		NodeID:          host,
		Listen:          "127.0.0.1:50055",
		Socket:          DefaultSocket(),
		MetricsListen:   "127.0.0.1:9464",
		PoolSize:        256 << 20,
		PoolHugePages:   "none",
		Eviction:        string(evict.KindAdaptive),
		Transport:       TransportAuto,
		NICs:            "1",
		QPsPerPeer:      2,
		RelaxedOrdering: true,
		GIDIndex:        -1,
		QPTimeout:       -1,
		QPRetryCount:    7,
		CQBusyPoll:      20 * time.Microsecond,
		TCPDataListen:   "",
		TCPQPNStart:     0x100,
		RDMAIdleTimeout: 60 * time.Second,
		LockTimeout:     120 * time.Second,
		GCInterval:      time.Second,
		ShutdownTimeout: 10 * time.Second,
		LogLevel:        "info",
		LogFormat:       "auto",
		ClusterTTL:      10 * time.Second,
		KVEventsTopic:   "kv@{node}@{model}",

		MaxSessionsPerPeer: DefaultMaxSessionsPerPeer,
	}
}

// SystemSocket is the socket of a pegad run as a system service (see
// localsock.SystemSocket).
const SystemSocket = localsock.SystemSocket

// DefaultSocket is the default --socket (see localsock.Default); pegactl
// uses the same rule, so both agree without flags.
func DefaultSocket() string { return localsock.Default() }

// FlagConfig is the flag (and PEGAD_CONFIG env) naming the YAML file.
const FlagConfig = "config"

// Keys lists every settable key, sorted.
func Keys() []string {
	t := reflect.TypeOf(Config{})
	keys := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if k := t.Field(i).Tag.Get("mapstructure"); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// checkZMQEndpoint accepts what the KV-events publisher binds:
// tcp://HOST:PORT (HOST may be *) or ipc://PATH.
func checkZMQEndpoint(ep string) error {
	scheme, rest, ok := strings.Cut(ep, "://")
	switch {
	case !ok:
		return fmt.Errorf("%q: want tcp://HOST:PORT or ipc://PATH", ep)
	case scheme == "ipc":
		if rest == "" {
			return fmt.Errorf("%q: empty ipc path", ep)
		}
		return nil
	case scheme != "tcp":
		return fmt.Errorf("%q: only tcp:// and ipc:// are served", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("%q: %w", ep, err)
	}
	if host == "*" {
		host = ""
	}
	return checkHostPort(net.JoinHostPort(host, port), true)
}

// RegisterFlags adds --config and one flag per key to fs, with the defaults
// of d (normally Default()).
func RegisterFlags(fs *pflag.FlagSet, d Config) {
	fs.String(FlagConfig, "", "YAML config file (env PEGAD_CONFIG); its keys are the flag names")
	fs.String("node-id", d.NodeID, "node name shown to peers and in sessions (defaults to the hostname)")
	fs.String("listen", d.Listen, "peer gRPC listen address (PeerService)")
	fs.String("advertise", d.Advertise, "address peers use to reach this node (default: the bound --listen address)")
	fs.String("socket", d.Socket, "unix socket for the local and admin API")
	fs.String("metrics-listen", d.MetricsListen, "HTTP address serving /metrics and /healthz (empty disables)")
	fs.String("debug-listen", d.DebugListen, "loopback HTTP address serving /debug/pprof/ (empty, the default, disables)")
	fs.String("pool-size", d.PoolSize.String(), "pinned host-memory pool size (e.g. 256MiB, 16GiB, 512M, bytes)")
	fs.String("pool-hugepages", d.PoolHugePages, "pool pages: none|thp|2M|1G (2M/1G must be reserved, vm.nr_hugepages)")
	fs.StringArray("namespace-quota", d.NamespaceQuota, "most pool bytes a namespace or namespace prefix may hold, NS=SIZE (repeatable; longest prefix wins; at its quota a namespace evicts its own blocks; SIGHUP reloads)")
	fs.String("eviction", d.Eviction, "eviction policy: adaptive|prefix|lru (adaptive: W-TinyLFU admission, window chosen by shadow caches; prefix: chain-aware, adaptive recency/frequency)")
	fs.String("transport", d.Transport, "data transport: auto|verbs|tcp (auto: verbs when devices exist, else tcp)")
	fs.String("nics", d.NICs, "tcp: number of software NICs; verbs: a count or a comma list of device names, optionally RAIL=DEVICE")
	fs.String("nic-numa", d.NICNUMA, "NUMA node of NICs sysfs gives none (e.g. rxe): NIC=NODE,... (rxe0=0,rxe1=1); replaces sysfs for the named NICs")
	fs.Int("qps-per-peer", d.QPsPerPeer, "RC queue pairs per peer per NIC")
	fs.Bool("relaxed-ordering", d.RelaxedOrdering, "verbs: register the pool with relaxed ordering (--relaxed-ordering=false turns it off)")
	fs.Bool("memory-windows", d.MemoryWindows, "verbs: a peer READs only the blocks it locked, through type-2 memory windows bound per lock")
	fs.Int("gid-index", d.GIDIndex, "verbs: GID table entry of every port (-1: RoCE v2, routable IPv4 first)")
	fs.Int("traffic-class", d.TrafficClass, "verbs: GRH traffic class, DSCP<<2 (e.g. 106 = DSCP 26)")
	fs.Int("service-level", d.ServiceLevel, "verbs: InfiniBand service level 0..15")
	fs.Int("pkey-index", d.PKeyIndex, "verbs: P_Key table index of every QP")
	fs.Int("qp-timeout", d.QPTimeout, "local ACK timeout exponent of every QP, 4.096us*2^N per try (-1: transport default, verbs 14, tcp 17)")
	fs.Int("qp-retry-count", d.QPRetryCount, "transport retries of every QP, 0..7: a silent peer fails READs after (N+1) ACK timeouts")
	fs.Duration("cq-busy-poll", d.CQBusyPoll, "verbs: how long a completion wait busy-polls before it blocks (0: block at once)")
	fs.String("tcp-data-listen", d.TCPDataListen, "tcp transport: data listener address (port 0: ephemeral; port P: NIC i uses P+i; default: --listen's host, ephemeral ports, advertised with --advertise's host)")
	fs.String("tcp-qpn-start", "0x"+strconv.FormatUint(uint64(d.TCPQPNStart), 16), "tcp transport: first QPN allocated per device")
	fs.Duration("rdma-idle-timeout", d.RDMAIdleTimeout, "holder: free a requester's connection once its data connections have all been closed this long (tcp), or it has held no transfer session this long (verbs)")
	fs.Duration("lock-timeout", d.LockTimeout, "transfer lock (session) timeout")
	fs.Duration("lock-max-lifetime", d.LockMaxLifetime, "longest a session may live across renewals (0: 10 x lock-timeout)")
	fs.Duration("gc-interval", d.GCInterval, "lock sweeper interval")
	fs.Duration("shutdown-timeout", d.ShutdownTimeout, "graceful shutdown bound before in-flight RPCs are cut")
	fs.String("log-level", d.LogLevel, "log level: trace|debug|info|warn|error")
	fs.String("log-format", d.LogFormat, "log format: json|console|auto (auto: console on a terminal, else json)")
	fs.Bool("peer-reflection", d.PeerReflection, "enable gRPC server reflection on the peer port")
	fs.String("cluster-redis", d.ClusterRedis, "cluster index on Redis: redis:// or rediss:// URL, or a comma list for Redis Cluster (empty: standalone)")
	fs.Duration("cluster-ttl", d.ClusterTTL, "cluster membership record lifetime, refreshed every third of it")
	fs.String("kv-events-endpoint", d.KVEventsEndpoint, "publish vLLM KV events on a ZMQ PUB socket bound here: tcp://*:5557, tcp://HOST:PORT or ipc://PATH (empty: off)")
	fs.String("kv-events-replay-endpoint", d.KVEventsReplayEndpoint, "KV events: ZMQ ROUTER socket replaying missed messages, vLLM's protocol (empty: none)")
	fs.String("kv-events-topic", d.KVEventsTopic, "KV events: topic of each message; {node}, {namespace}, {model} (namespace before its first @) and {rank} (after it) are expanded")
	fs.String("peer-tls-cert", d.PeerTLSCert, "peer mTLS: this node's certificate (PEM); with --peer-tls-key and --peer-tls-ca")
	fs.String("peer-tls-key", d.PeerTLSKey, "peer mTLS: the certificate's private key (PEM)")
	fs.String("peer-tls-ca", d.PeerTLSCA, "peer mTLS: CA bundle (PEM) that signs every node's certificate")
	fs.String("peer-allow", d.PeerAllow, "peer mTLS: comma list of certificate identities (DNS/URI SANs, * globs) allowed on the peer port")
	fs.Int("max-sessions-per-peer", d.MaxSessionsPerPeer, "live transfer sessions one peer may hold (0: unlimited)")
	fs.String("max-pinned-bytes-per-peer", d.MaxPinnedBytesPerPeer.String(), "bytes one peer's sessions may pin (0: pool-size/2)")
	fs.String("max-pinned-bytes", d.MaxPinnedBytes.String(), "bytes all peers' sessions may pin together (0: 75% of pool-size)")
	fs.String("socket-group", d.SocketGroup, "group (name or numeric gid) owning the local socket (mode 0660); empty: pegad's group")
	fs.String("ssd-path", d.SSDPath, "SSD tier: comma list of directories, one per device (empty: no SSD tier)")
	fs.String("ssd-size", d.SSDSize.String(), "SSD tier: log size per --ssd-path directory, preallocated (e.g. 100GiB)")
}

// PeerTLSFiles are the peer TLS files as peertls takes them.
func (c *Config) PeerTLSFiles() peertls.Files {
	return peertls.Files{Cert: c.PeerTLSCert, Key: c.PeerTLSKey, CA: c.PeerTLSCA}
}

// PeerTLS reports whether the peer port runs mutual TLS.
func (c *Config) PeerTLS() bool {
	return c.PeerTLSCert != "" && c.PeerTLSKey != "" && c.PeerTLSCA != ""
}

// EffectiveMaxPinnedBytesPerPeer is MaxPinnedBytesPerPeer, or its default.
func (c *Config) EffectiveMaxPinnedBytesPerPeer() ByteSize {
	if c.MaxPinnedBytesPerPeer > 0 {
		return c.MaxPinnedBytesPerPeer
	}
	return c.PoolSize / PeerShareDivisor
}

// EffectiveMaxPinnedBytes is MaxPinnedBytes, or its default.
func (c *Config) EffectiveMaxPinnedBytes() ByteSize {
	if c.MaxPinnedBytes > 0 {
		return c.MaxPinnedBytes
	}
	return c.PoolSize - c.PoolSize/NodeEvictableDivisor
}

// EffectiveLockMaxLifetime is LockMaxLifetime, or its default.
func (c *Config) EffectiveLockMaxLifetime() time.Duration {
	if c.LockMaxLifetime > 0 {
		return c.LockMaxLifetime
	}
	return LifetimeFactor * c.LockTimeout
}

// NICSpec interprets the nics key: a count (names nil) or a list of device
// names (count = len(names)), each optionally named by its rail
// (RAIL=DEVICE; NICRails has the rails).
func (c *Config) NICSpec() (count int, names []string, err error) {
	count, names, _, err = c.nicSpec()
	return count, names, err
}

// NICRails is the rail of each device NICSpec names, in the same order,
// when the nics key maps rails (rail0=mlx5_0,rail1=mlx5_3); nil when it
// does not (or is invalid: Validate reports that).
func (c *Config) NICRails() []string {
	_, _, rails, err := c.nicSpec()
	if err != nil {
		return nil
	}
	return rails
}

// MaxNUMANode bounds a node named by nic-numa (the kernel's MAX_NUMNODES
// is at most 1024).
const MaxNUMANode = 1023

// NICNUMANodes interprets the nic-numa key: the NUMA node named for each
// NIC; nil when the key is empty.
func (c *Config) NICNUMANodes() (map[string]int, error) {
	s := strings.TrimSpace(c.NICNUMA)
	if s == "" {
		return nil, nil
	}
	out := make(map[string]int)
	for _, p := range strings.Split(s, ",") {
		name, node, ok := strings.Cut(strings.TrimSpace(p), "=")
		name, node = strings.TrimSpace(name), strings.TrimSpace(node)
		if !ok || name == "" || node == "" {
			return nil, fmt.Errorf("%q: want NIC=NODE entries (rxe0=0,rxe1=1)", c.NICNUMA)
		}
		n, err := strconv.Atoi(node)
		if err != nil || n < 0 || n > MaxNUMANode {
			return nil, fmt.Errorf("%q: node %q of %s is not a number in 0..%d", c.NICNUMA, node, name, MaxNUMANode)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%q names %s twice", c.NICNUMA, name)
		}
		out[name] = n
	}
	return out, nil
}

// maxRailLen bounds a rail name (it travels in every handshake).
const maxRailLen = 64

func (c *Config) nicSpec() (count int, names, rails []string, err error) {
	s := strings.TrimSpace(c.NICs)
	if s == "" {
		return 0, nil, nil, fmt.Errorf("must not be empty")
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > MaxNICs {
			return 0, nil, nil, fmt.Errorf("count %d is outside 1..%d", n, MaxNICs)
		}
		return n, nil, nil, nil
	}
	seen, seenRail := map[string]bool{}, map[string]bool{}
	for i, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		rail, dev, mapped := strings.Cut(p, "=")
		if !mapped {
			dev = p
		}
		rail, dev = strings.TrimSpace(rail), strings.TrimSpace(dev)
		switch {
		case i > 0 && mapped != (rails != nil):
			return 0, nil, nil, fmt.Errorf("%q mixes RAIL=DEVICE entries with bare device names: name a rail for every device or for none", c.NICs)
		case dev == "":
			return 0, nil, nil, fmt.Errorf("%q has an empty device name", c.NICs)
		case seen[dev]:
			return 0, nil, nil, fmt.Errorf("device %q listed twice", dev)
		case mapped && rail == "":
			return 0, nil, nil, fmt.Errorf("%q has an empty rail name", c.NICs)
		case mapped && len(rail) > maxRailLen:
			return 0, nil, nil, fmt.Errorf("rail %q is longer than %d bytes", rail, maxRailLen)
		case seenRail[rail]:
			return 0, nil, nil, fmt.Errorf("rail %q named twice", rail)
		}
		seen[dev] = true
		names = append(names, dev)
		if mapped {
			seenRail[rail] = true
			rails = append(rails, rail)
		}
	}
	if len(names) > MaxNICs {
		return 0, nil, nil, fmt.Errorf("%d devices is more than %d", len(names), MaxNICs)
	}
	return len(names), names, rails, nil
}
