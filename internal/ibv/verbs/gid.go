package verbs

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/pegaflow/pegad/internal/ibv"
)

// DefaultSysfsRoot is where the kernel describes RDMA devices.
const DefaultSysfsRoot = "/sys/class/infiniband"

// gidType is a GID table entry's type, as enum ibv_gid_type plus unknown.
type gidType int

const (
	gidTypeIB      gidType = 0 // also "IB/RoCE v1" on an Ethernet port
	gidTypeRoCEv1  gidType = 1
	gidTypeRoCEv2  gidType = 2
	gidTypeUnknown gidType = -1
)

func (t gidType) String() string {
	switch t {
	case gidTypeIB:
		return "IB"
	case gidTypeRoCEv1:
		return "RoCE v1"
	case gidTypeRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// gidEntry is one populated GID table entry of a port.
type gidEntry struct {
	Index int
	GID   ibv.GID
	Type  gidType
}

// parseGID reads the kernel's text form of a GID: eight groups of four hex
// digits separated by colons ("fe80:0000:0000:0000:0202:c9ff:fe00:0001").
func parseGID(s string) (ibv.GID, error) {
	var g ibv.GID
	s = strings.TrimSpace(s)
	groups := strings.Split(s, ":")
	if len(groups) != 8 {
		return g, fmt.Errorf("gid %q: want 8 groups of 4 hex digits", s)
	}
	for i, grp := range groups {
		if len(grp) != 4 {
			return g, fmt.Errorf("gid %q: group %d is not 4 hex digits", s, i)
		}
		if _, err := hex.Decode(g[2*i:2*i+2], []byte(grp)); err != nil {
			return g, fmt.Errorf("gid %q: %w", s, err)
		}
	}
	return g, nil
}

// formatGID is the inverse of parseGID.
func formatGID(g ibv.GID) string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(hex.EncodeToString(g[i : i+2]))
	}
	return b.String()
}

// parseGIDType reads gid_attrs/types/<idx>: "IB/RoCE v1" or "RoCE v2".
// "IB/RoCE v1" means IB on an InfiniBand port and RoCE v1 on Ethernet.
func parseGIDType(s string, ethernet bool) gidType {
	switch strings.TrimSpace(s) {
	case "RoCE v2":
		return gidTypeRoCEv2
	case "IB/RoCE v1", "RoCE v1", "IB":
		if ethernet {
			return gidTypeRoCEv1
		}
		return gidTypeIB
	}
	return gidTypeUnknown
}

// isIPv4Mapped reports ::ffff:a.b.c.d, the GID form of an IPv4 address.
func isIPv4Mapped(g ibv.GID) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

func isLinkLocal(g ibv.GID) bool { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

// isIPv4LinkLocal reports an IPv4-mapped 169.254/16 address.
func isIPv4LinkLocal(g ibv.GID) bool { return isIPv4Mapped(g) && g[12] == 169 && g[13] == 254 }

// sysfs reads the parts of /sys/class/infiniband pegad needs. Root is
// overridable so tests run against fake trees.
type sysfs struct{ root string }

func (s sysfs) portDir(dev string, port uint8) string {
	return filepath.Join(s.root, dev, "ports", strconv.Itoa(int(port)))
}

// numaNode reads <dev>/device/numa_node; -1 when unknown (the kernel writes
// -1 on single-node hosts; virtual devices such as rxe have no file).
func (s sysfs) numaNode(dev string) int {
	b, err := os.ReadFile(filepath.Join(s.root, dev, "device", "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// gidType reads ports/<p>/gid_attrs/types/<idx>; unknown when the file is
// missing or unreadable (the kernel returns EINVAL for an empty entry).
func (s sysfs) gidType(dev string, port uint8, idx int, ethernet bool) gidType {
	b, err := os.ReadFile(filepath.Join(s.portDir(dev, port), "gid_attrs", "types", strconv.Itoa(idx)))
	if err != nil {
		return gidTypeUnknown
	}
	return parseGIDType(string(b), ethernet)
}

// gids reads the populated entries of ports/<p>/gids (all-zero entries are
// empty slots and skipped), with their types.
func (s sysfs) gids(dev string, port uint8, ethernet bool) ([]gidEntry, error) {
	dir := filepath.Join(s.portDir(dev, port), "gids")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []gidEntry
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil || idx < 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		g, err := parseGID(string(b))
		if err != nil || g == (ibv.GID{}) {
			continue
		}
		out = append(out, gidEntry{Index: idx, GID: g, Type: s.gidType(dev, port, idx, ethernet)})
	}
	sortGIDs(out)
	return out, nil
}

func sortGIDs(g []gidEntry) {
	slices.SortFunc(g, func(a, b gidEntry) int { return cmp.Compare(a.Index, b.Index) })
}
