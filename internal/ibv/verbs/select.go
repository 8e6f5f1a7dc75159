package verbs

import (
	"fmt"
	"strings"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Values of enum ibv_port_state and enum ibv_link_layer.
const (
	portActive = 4

	linkLayerUnspecified = 0 // older kernels: InfiniBand
	linkLayerInfiniBand  = 1
	linkLayerEthernet    = 2
)

func portStateName(s int) string {
	switch s {
	case 0:
		return "NOP"
	case 1:
		return "DOWN"
	case 2:
		return "INIT"
	case 3:
		return "ARMED"
	case 4:
		return "ACTIVE"
	case 5:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state(%d)", s)
}

func linkLayerName(l int) string {
	if l == linkLayerEthernet {
		return "Ethernet"
	}
	return "InfiniBand"
}

// portDesc is what the provider learned about one port.
type portDesc struct {
	Num       uint8
	State     int // enum ibv_port_state
	LinkLayer int // enum ibv_link_layer
	LID       uint16
	ActiveMTU int // enum ibv_mtu
	Flags     int // port_attr.flags (IBV_QPF_GRH_REQUIRED)
	PKeys     int // pkey_tbl_len
	GIDs      []gidEntry
}

// portFlagGRHRequired is IBV_QPF_GRH_REQUIRED: every address vector on
// the port needs a GRH (ibv_query_port(3)).
const portFlagGRHRequired = 1

// portChoice is the port (and GID) a device is used through.
type portChoice struct {
	Port      uint8
	LinkLayer string
	Ethernet  bool
	LID       uint16
	GID       gidEntry
	MTU       int // bytes
	// GRHRequired: InfiniBand port whose QPs must address the peer with a
	// GRH too (ibv_modify_qp(3)); RoCE always does.
	GRHRequired bool
	PKeys       int // P_Key table length; 0 unknown
}

// choosePort picks the port a deployment should use: the first ACTIVE port
// (or only port want, when non-zero) that can carry RC traffic. InfiniBand
// needs a unicast LID assigned by the subnet manager; Ethernet (RoCE) needs
// a usable GID (see chooseGID). gidIndex >= 0 forces that GID table entry.
// The error names every port and why it was passed over.
func choosePort(ports []portDesc, want uint8, gidIndex int) (portChoice, error) {
	var why []string
	for _, p := range ports {
		if want != 0 && p.Num != want {
			continue
		}
		c, err := usePort(p, gidIndex)
		if err == nil {
			return c, nil
		}
		why = append(why, fmt.Sprintf("port %d: %v", p.Num, err))
	}
	if want != 0 && len(why) == 0 {
		return portChoice{}, &kindError{fmt.Sprintf("no port %d", want), ibv.ErrNoDevice}
	}
	if len(why) == 0 {
		return portChoice{}, &kindError{"no ports", ibv.ErrUnavailable}
	}
	return portChoice{}, &kindError{"no usable port (" + strings.Join(why, "; ") + ")", ibv.ErrUnavailable}
}

// kindError is a message that matches a sentinel without repeating its
// text, so the reason stays one readable line in the daemon's log.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func usePort(p portDesc, gidIndex int) (portChoice, error) {
	if p.State != portActive {
		return portChoice{}, fmt.Errorf("state %s", portStateName(p.State))
	}
	mtu := mtuBytes(p.ActiveMTU)
	if mtu == 0 {
		return portChoice{}, fmt.Errorf("active MTU enum %d unknown", p.ActiveMTU)
	}
	c := portChoice{Port: p.Num, LinkLayer: linkLayerName(p.LinkLayer), Ethernet: p.LinkLayer == linkLayerEthernet, LID: p.LID, MTU: mtu,
		GRHRequired: p.LinkLayer != linkLayerEthernet && p.Flags&portFlagGRHRequired != 0, PKeys: p.PKeys}
	if c.Ethernet {
		g, err := chooseGID(p.GIDs, gidIndex)
		if err != nil {
			return portChoice{}, err
		}
		c.GID = g
		return c, nil
	}
	if p.LID == 0 || p.LID >= 0xc000 {
		return portChoice{}, fmt.Errorf("InfiniBand LID %#x not assigned (is a subnet manager running?)", p.LID)
	}
	// On InfiniBand the GID at index 0 (subnet prefix + port GUID) is the
	// port's identity; it is carried in the endpoint but not used to route.
	want := 0
	if gidIndex >= 0 {
		want = gidIndex
	}
	for _, g := range p.GIDs {
		if g.Index == want {
			c.GID = g
			break
		}
	}
	if c.GRHRequired && c.GID.GID == (ibv.GID{}) {
		return portChoice{}, fmt.Errorf("InfiniBand port requires a GRH but GID index %d not populated", want)
	}
	return c, nil
}

// gidRank orders RoCE GIDs: RoCE v2 first (routable over UDP/IP), and
// within a type an IPv4-mapped GID before a global IPv6 one before the
// link-local one derived from the MAC; unknown types (no sysfs attributes)
// after v2, RoCE v1 last. Lower is better; -1 is unusable.
func gidRank(g gidEntry) int {
	if g.GID == (ibv.GID{}) {
		return -1
	}
	addr := 2
	switch {
	case isIPv4Mapped(g.GID) && !isIPv4LinkLocal(g.GID):
		addr = 0
	case isIPv4Mapped(g.GID):
		// 169.254/16 (RFC 3927) does not route: as link-local as fe80::.
	case !isLinkLocal(g.GID):
		addr = 1
	}
	switch g.Type {
	case gidTypeRoCEv2:
		return addr
	case gidTypeUnknown:
		return 3 + addr
	case gidTypeRoCEv1, gidTypeIB:
		return 6 + addr
	}
	return -1
}

// chooseGID picks the GID a RoCE port is addressed by: the best-ranked
// non-zero entry, lowest index among equals; or entry force when >= 0.
func chooseGID(gids []gidEntry, force int) (gidEntry, error) {
	if force >= 0 {
		for _, g := range gids {
			if g.Index == force {
				if g.GID == (ibv.GID{}) {
					return gidEntry{}, fmt.Errorf("GID index %d is empty", force)
				}
				return g, nil
			}
		}
		return gidEntry{}, fmt.Errorf("GID index %d not populated", force)
	}
	best, bestRank := gidEntry{}, -1
	for _, g := range gids {
		r := gidRank(g)
		if r < 0 {
			continue
		}
		if bestRank < 0 || r < bestRank || (r == bestRank && g.Index < best.Index) {
			best, bestRank = g, r
		}
	}
	if bestRank < 0 {
		return gidEntry{}, fmt.Errorf("no non-zero GID (is an IP address configured on the netdev?)")
	}
	return best, nil
}

// deviceInfo fills the model's description from a chosen port.
func deviceInfo(name string, numa int, c portChoice, maxQPWR, maxRd int) ibv.DeviceInfo {
	return ibv.DeviceInfo{
		Name:        name,
		NUMANode:    numa,
		Port:        c.Port,
		LinkLayer:   c.LinkLayer,
		GID:         c.GID.GID,
		GIDIndex:    c.GID.Index,
		LID:         c.LID,
		MTU:         c.MTU,
		MaxQPWR:     maxQPWR,
		MaxRdAtomic: maxRd,
	}
}

// parseDeviceName splits "mlx5_0" or "mlx5_0:2" (device and port).
func parseDeviceName(s string) (string, uint8, error) {
	dev, port, ok := strings.Cut(s, ":")
	if dev == "" {
		return "", 0, fmt.Errorf("empty device name: %w", ibv.ErrInvalidArgument)
	}
	if !ok {
		return dev, 0, nil
	}
	var n int
	if _, err := fmt.Sscanf(port, "%d", &n); err != nil || n < 1 || n > 255 || fmt.Sprint(n) != port {
		return "", 0, fmt.Errorf("device %q: port %q is not 1-255: %w", s, port, ibv.ErrInvalidArgument)
	}
	return dev, uint8(n), nil
}
