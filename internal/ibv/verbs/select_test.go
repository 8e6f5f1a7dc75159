package verbs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
)

func mustGID(t testing.TB, s string) ibv.GID {
	t.Helper()
	g, err := parseGID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestParseGID(t *testing.T) {
	tests := []struct {
		in   string
		want ibv.GID
		ok   bool
	}{
		{"fe80:0000:0000:0000:0202:c9ff:fe00:0001\n", ibv.GID{0xfe, 0x80, 8: 0x02, 9: 0x02, 10: 0xc9, 11: 0xff, 12: 0xfe, 15: 0x01}, true},
		{"0000:0000:0000:0000:0000:ffff:c0a8:0107", testGIDv4, true},
		{"0000:0000:0000:0000:0000:0000:0000:0000", ibv.GID{}, true},
		{"FE80:0000:0000:0000:0000:0000:0000:0001", ibv.GID{0xfe, 0x80, 15: 1}, true},
		{"fe80::1", ibv.GID{}, false},
		{"fe80:0000:0000:0000:0202:c9ff:fe00", ibv.GID{}, false},
		{"fe80:0000:0000:0000:0202:c9ff:fe00:00zz", ibv.GID{}, false},
		{"fe80:000:0000:0000:0202:c9ff:fe00:00001", ibv.GID{}, false},
		{"", ibv.GID{}, false},
	}
	for _, tc := range tests {
		got, err := parseGID(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseGID(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if back := formatGID(got); back != strings.ToLower(strings.TrimSpace(tc.in)) {
				t.Errorf("formatGID = %q, want %q", back, tc.in)
			}
		}
	}
}

func FuzzParseGID(f *testing.F) {
	f.Add("fe80:0000:0000:0000:0202:c9ff:fe00:0001")
	f.Add("0000:0000:0000:0000:0000:ffff:c0a8:0107\n")
	f.Add("::")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := parseGID(s)
		if err != nil {
			return
		}
		again, err := parseGID(formatGID(g))
		if err != nil || again != g {
			t.Fatalf("round trip of %q: %v %v", s, again, err)
		}
	})
}

func TestParseGIDType(t *testing.T) {
	tests := []struct {
		in       string
		ethernet bool
		want     gidType
	}{
		{"RoCE v2\n", true, gidTypeRoCEv2},
		{"IB/RoCE v1\n", true, gidTypeRoCEv1},
		{"IB/RoCE v1\n", false, gidTypeIB},
		{"garbage", true, gidTypeUnknown},
	}
	for _, tc := range tests {
		if got := parseGIDType(tc.in, tc.ethernet); got != tc.want {
			t.Errorf("parseGIDType(%q, %v) = %v, want %v", tc.in, tc.ethernet, got, tc.want)
		}
	}
}

// fakeDev writes a sysfs tree for one device: gids maps an index to its
// text and, optionally, its type ("" for no types file).
type fakeGID struct{ gid, typ string }

func fakeDev(t *testing.T, root, dev string, port int, numa string, gids map[int]fakeGID) {
	t.Helper()
	pdir := filepath.Join(root, dev, "ports", itoa(port))
	for _, d := range []string{filepath.Join(pdir, "gids"), filepath.Join(pdir, "gid_attrs", "types"), filepath.Join(root, dev, "device")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if numa != "" {
		write(t, filepath.Join(root, dev, "device", "numa_node"), numa)
	}
	for idx, g := range gids {
		write(t, filepath.Join(pdir, "gids", itoa(idx)), g.gid+"\n")
		if g.typ != "" {
			write(t, filepath.Join(pdir, "gid_attrs", "types", itoa(idx)), g.typ+"\n")
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

const zeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"

func TestSysfsGIDs(t *testing.T) {
	root := t.TempDir()
	fakeDev(t, root, "mlx5_0", 1, "1\n", map[int]fakeGID{
		0: {"fe80:0000:0000:0000:0a5c:2cff:fe11:2233", "IB/RoCE v1"},
		1: {"fe80:0000:0000:0000:0a5c:2cff:fe11:2233", "RoCE v2"},
		2: {"0000:0000:0000:0000:0000:ffff:0a00:0005", "IB/RoCE v1"},
		3: {"0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2"},
		4: {zeroGID, ""},
		5: {"not a gid", "RoCE v2"},
	})
	fs := sysfs{root: root}
	gids, err := fs.gids("mlx5_0", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	wantTypes := []gidType{gidTypeRoCEv1, gidTypeRoCEv2, gidTypeRoCEv1, gidTypeRoCEv2}
	if len(gids) != len(wantTypes) {
		t.Fatalf("got %d entries %+v, want 4 (zero and malformed skipped)", len(gids), gids)
	}
	for i, g := range gids {
		if g.Index != i || g.Type != wantTypes[i] {
			t.Fatalf("entry %d: %+v, want index %d type %v", i, g, i, wantTypes[i])
		}
	}
	best, err := chooseGID(gids, -1)
	if err != nil || best.Index != 3 {
		t.Fatalf("chooseGID = %+v, %v; want index 3 (RoCE v2, IPv4-mapped)", best, err)
	}
	if n := fs.numaNode("mlx5_0"); n != 1 {
		t.Fatalf("numa %d, want 1", n)
	}
	if _, err := fs.gids("mlx5_9", 1, true); err == nil {
		t.Fatal("gids of a missing device: no error")
	}
}

func TestSysfsNUMA(t *testing.T) {
	root := t.TempDir()
	fakeDev(t, root, "a", 1, "-1\n", nil)
	fakeDev(t, root, "b", 1, "", nil)
	fakeDev(t, root, "c", 1, "x\n", nil)
	fakeDev(t, root, "d", 1, "3", nil)
	fs := sysfs{root: root}
	for dev, want := range map[string]int{"a": -1, "b": -1, "c": -1, "d": 3, "missing": -1} {
		if got := fs.numaNode(dev); got != want {
			t.Errorf("numaNode(%s) = %d, want %d", dev, got, want)
		}
	}
}

func TestChooseGID(t *testing.T) {
	ll := mustGID(t, "fe80:0000:0000:0000:0a5c:2cff:fe11:2233")
	v4 := mustGID(t, "0000:0000:0000:0000:0000:ffff:0a00:0005")
	v6 := mustGID(t, "2001:0db8:0000:0000:0000:0000:0000:0042")
	apipa := mustGID(t, "0000:0000:0000:0000:0000:ffff:a9fe:0102") // 169.254.1.2
	tests := []struct {
		name  string
		gids  []gidEntry
		force int
		want  int // index; -1: error
	}{
		{"v2 v4-mapped beats v2 link-local", []gidEntry{{1, ll, gidTypeRoCEv2}, {3, v4, gidTypeRoCEv2}}, -1, 3},
		{"v2 global v6 beats link-local", []gidEntry{{1, ll, gidTypeRoCEv2}, {5, v6, gidTypeRoCEv2}}, -1, 5},
		{"v4-mapped beats global v6", []gidEntry{{5, v6, gidTypeRoCEv2}, {7, v4, gidTypeRoCEv2}}, -1, 7},
		{"v2 link-local beats v1 v4", []gidEntry{{2, v4, gidTypeRoCEv1}, {1, ll, gidTypeRoCEv2}}, -1, 1},
		{"unknown type beats v1", []gidEntry{{2, v4, gidTypeRoCEv1}, {4, v4, gidTypeUnknown}}, -1, 4},
		{"v1 only", []gidEntry{{0, ll, gidTypeRoCEv1}, {2, v4, gidTypeRoCEv1}}, -1, 2},
		{"global v6 beats v4 link-local 169.254", []gidEntry{{2, apipa, gidTypeRoCEv2}, {5, v6, gidTypeRoCEv2}}, -1, 5},
		{"169.254 ranks with fe80 (lower index wins)", []gidEntry{{4, apipa, gidTypeRoCEv2}, {1, ll, gidTypeRoCEv2}}, -1, 1},
		{"lowest index among equals", []gidEntry{{9, v4, gidTypeRoCEv2}, {3, v4, gidTypeRoCEv2}}, -1, 3},
		{"zero gids only", []gidEntry{{0, ibv.GID{}, gidTypeRoCEv2}}, -1, -1},
		{"none", nil, -1, -1},
		{"forced", []gidEntry{{1, ll, gidTypeRoCEv1}, {3, v4, gidTypeRoCEv2}}, 1, 1},
		{"forced missing", []gidEntry{{3, v4, gidTypeRoCEv2}}, 2, -1},
		{"forced zero", []gidEntry{{2, ibv.GID{}, gidTypeRoCEv2}}, 2, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := chooseGID(tc.gids, tc.force)
			if tc.want < 0 {
				if err == nil {
					t.Fatalf("chose %+v, want error", g)
				}
				return
			}
			if err != nil || g.Index != tc.want {
				t.Fatalf("got %+v, %v; want index %d", g, err, tc.want)
			}
		})
	}
}

func TestChoosePort(t *testing.T) {
	v4 := mustGID(t, "0000:0000:0000:0000:0000:ffff:0a00:0005")
	ibGID := mustGID(t, "fe80:0000:0000:0000:0002:c903:0001:0002")
	roce := func(num uint8, state int) portDesc {
		return portDesc{Num: num, State: state, LinkLayer: linkLayerEthernet, ActiveMTU: mtu1024,
			GIDs: []gidEntry{{3, v4, gidTypeRoCEv2}}}
	}
	ib := func(num uint8, state int, lid uint16) portDesc {
		return portDesc{Num: num, State: state, LinkLayer: linkLayerInfiniBand, LID: lid, ActiveMTU: mtu4096,
			GIDs: []gidEntry{{0, ibGID, gidTypeIB}}}
	}
	tests := []struct {
		name     string
		ports    []portDesc
		want     uint8
		wantPort uint8 // 0: error
		wantErr  error
		errText  string
	}{
		{"first active roce", []portDesc{roce(1, 1), roce(2, portActive)}, 0, 2, nil, ""},
		{"first of two active", []portDesc{roce(1, portActive), roce(2, portActive)}, 0, 1, nil, ""},
		{"ib with lid", []portDesc{ib(1, portActive, 7)}, 0, 1, nil, ""},
		{"unspecified link layer is ib", []portDesc{{Num: 1, State: portActive, LID: 3, ActiveMTU: mtu2048}}, 0, 1, nil, ""},
		{"ib without lid skipped", []portDesc{ib(1, portActive, 0), ib(2, portActive, 9)}, 0, 2, nil, ""},
		{"ib no lid anywhere", []portDesc{ib(1, portActive, 0)}, 0, 0, ibv.ErrUnavailable, "subnet manager"},
		{"all down", []portDesc{roce(1, 1), ib(2, 2, 5)}, 0, 0, ibv.ErrUnavailable, "port 1: state DOWN; port 2: state INIT"},
		{"roce without gid", []portDesc{{Num: 1, State: portActive, LinkLayer: linkLayerEthernet, ActiveMTU: mtu1024}}, 0, 0, ibv.ErrUnavailable, "no non-zero GID"},
		{"bad mtu", []portDesc{{Num: 1, State: portActive, LinkLayer: linkLayerEthernet, ActiveMTU: 9}}, 0, 0, ibv.ErrUnavailable, "MTU"},
		{"wanted port", []portDesc{roce(1, portActive), roce(2, portActive)}, 2, 2, nil, ""},
		{"wanted port down", []portDesc{roce(1, portActive), roce(2, 1)}, 2, 0, ibv.ErrUnavailable, "port 2: state DOWN"},
		{"wanted port missing", []portDesc{roce(1, portActive)}, 3, 0, ibv.ErrNoDevice, "no port 3"},
		{"no ports", nil, 0, 0, ibv.ErrUnavailable, "no ports"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := choosePort(tc.ports, tc.want, -1)
			if tc.wantPort == 0 {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got %+v, %v; want %v containing %q", c, err, tc.wantErr, tc.errText)
				}
				if strings.Contains(err.Error(), "ibv:") {
					t.Fatalf("reason %q repeats the sentinel's text", err)
				}
				return
			}
			if err != nil || c.Port != tc.wantPort {
				t.Fatalf("got %+v, %v; want port %d", c, err, tc.wantPort)
			}
		})
	}
}

func TestChoosePortFillsInfo(t *testing.T) {
	v4 := mustGID(t, "0000:0000:0000:0000:0000:ffff:0a00:0005")
	c, err := choosePort([]portDesc{{Num: 1, State: portActive, LinkLayer: linkLayerEthernet, ActiveMTU: mtu4096,
		GIDs: []gidEntry{{3, v4, gidTypeRoCEv2}}}}, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	info := deviceInfo("mlx5_0", 1, c, 32768, 16)
	want := ibv.DeviceInfo{Name: "mlx5_0", NUMANode: 1, Port: 1, LinkLayer: "Ethernet", GID: v4, GIDIndex: 3,
		MTU: 4096, MaxQPWR: 32768, MaxRdAtomic: 16}
	if info != want {
		t.Fatalf("got  %+v\nwant %+v", info, want)
	}
	line := describeDevices([]ibv.DeviceInfo{info})
	if !strings.Contains(line, "mlx5_0 port 1 Ethernet gid[3] 0000:0000:0000:0000:0000:ffff:0a00:0005 mtu 4096 numa 1") {
		t.Fatalf("describe: %q", line)
	}
}

func TestParseDeviceName(t *testing.T) {
	tests := []struct {
		in   string
		dev  string
		port uint8
		ok   bool
	}{
		{"mlx5_0", "mlx5_0", 0, true},
		{"mlx5_0:2", "mlx5_0", 2, true},
		{"rxe0:1", "rxe0", 1, true},
		{"", "", 0, false},
		{":1", "", 0, false},
		{"mlx5_0:0", "", 0, false},
		{"mlx5_0:256", "", 0, false},
		{"mlx5_0:x", "", 0, false},
		{"mlx5_0:01", "", 0, false},
	}
	for _, tc := range tests {
		dev, port, err := parseDeviceName(tc.in)
		if (err == nil) != tc.ok || dev != tc.dev || port != tc.port {
			t.Errorf("parseDeviceName(%q) = %q, %d, %v", tc.in, dev, port, err)
		}
		if err != nil && !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("parseDeviceName(%q): %v, want ErrInvalidArgument", tc.in, err)
		}
	}
}
