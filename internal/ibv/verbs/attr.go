package verbs

import (
	"fmt"

	"github.com/pegaflow/pegad/internal/ibv"
)

// MTU values of enum ibv_mtu.
const (
	mtu256  = 1
	mtu512  = 2
	mtu1024 = 3
	mtu2048 = 4
	mtu4096 = 5
)

// mtuBytes maps an enum ibv_mtu to bytes; 0 for an unknown value.
func mtuBytes(e int) int {
	if e < mtu256 || e > mtu4096 {
		return 0
	}
	return 256 << (e - 1)
}

// mtuEnum maps bytes to enum ibv_mtu; 0 unless bytes is one of the five
// IB MTUs.
func mtuEnum(bytes int) int {
	for e := mtu256; e <= mtu4096; e++ {
		if mtuBytes(e) == bytes {
			return e
		}
	}
	return 0
}

// pathMTU is the MTU used on a connection, in bytes: the smaller of the two
// ports' active MTUs (a remote that did not say uses ours), further capped
// by an explicit request.
func pathMTU(local, remote, requested int) (int, error) {
	if mtuEnum(local) == 0 {
		return 0, fmt.Errorf("local active MTU %d: %w", local, ibv.ErrInvalidArgument)
	}
	m := local
	if remote != 0 {
		if mtuEnum(remote) == 0 {
			return 0, fmt.Errorf("remote MTU %d: %w", remote, ibv.ErrInvalidArgument)
		}
		m = min(m, remote)
	}
	if requested != 0 {
		if mtuEnum(requested) == 0 {
			return 0, fmt.Errorf("requested MTU %d is not 256, 512, 1024, 2048 or 4096: %w", requested, ibv.ErrInvalidArgument)
		}
		m = min(m, requested)
	}
	return m, nil
}

// localPort is what a QP's device says about the port it uses.
type localPort struct {
	Num      uint8
	Ethernet bool // RoCE: address by GID; InfiniBand: by LID
	// GRHRequired: an InfiniBand port that needs a GRH besides the LID
	// (IBV_QPF_GRH_REQUIRED).
	GRHRequired bool
	GIDIndex    int
	PKeyIndex   uint16 // P_Key table entry the QPs use (Options.PKeyIndex)
	MTU         int    // active MTU, bytes
	MaxRdAtom   int    // device max_qp_rd_atom (responder resources)
	MaxInitRd   int    // device max_qp_init_rd_atom (initiator depth)
}

// connParams are the plain values the C side copies into ibv_qp_attr for
// the RTR and RTS transitions.
type connParams struct {
	PathMTU         int // enum ibv_mtu
	DestQPN         uint32
	RqPSN           uint32
	SqPSN           uint32
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MaxRdAtomic     uint8
	Port            uint8
	IsGlobal        bool
	SGIDIndex       uint8
	HopLimit        uint8
	TrafficClass    uint8
	SL              uint8
	DLID            uint16
	DGID            ibv.GID
}

const psnMask = 1<<24 - 1

// buildConnParams checks a connect request and derives the RTR/RTS
// values: path MTU min(local, remote, requested); RoCE addresses the peer by
// GID through a GRH (is_global, sgid_index, hop_limit), InfiniBand by LID,
// plus the GRH when the port requires one (ibv_modify_qp(3));
// read depths are clamped to what the device supports (an RTS with a larger
// max_rd_atomic fails with EINVAL on real HCAs).
func buildConnParams(lp localPort, localPSN uint32, remote ibv.Endpoint, a ibv.ConnectAttr) (connParams, error) {
	var p connParams
	mtu, err := pathMTU(lp.MTU, remote.MTU, a.MTU)
	if err != nil {
		return p, err
	}
	switch {
	case remote.QPN == 0 || remote.QPN > 1<<24-1:
		return p, fmt.Errorf("remote QPN %d: %w", remote.QPN, ibv.ErrInvalidArgument)
	case remote.PSN > psnMask:
		return p, fmt.Errorf("remote PSN %#x exceeds 24 bits: %w", remote.PSN, ibv.ErrInvalidArgument)
	case localPSN > psnMask:
		return p, fmt.Errorf("local PSN %#x exceeds 24 bits: %w", localPSN, ibv.ErrInvalidArgument)
	case a.Timeout > 31:
		return p, fmt.Errorf("timeout exponent %d exceeds 31: %w", a.Timeout, ibv.ErrInvalidArgument)
	case a.RetryCnt > 7 || a.RNRRetry > 7:
		return p, fmt.Errorf("retry_cnt %d / rnr_retry %d exceed 7: %w", a.RetryCnt, a.RNRRetry, ibv.ErrInvalidArgument)
	case a.MinRNRTimer > 31:
		return p, fmt.Errorf("min_rnr_timer %d exceeds 31: %w", a.MinRNRTimer, ibv.ErrInvalidArgument)
	case a.SL > 15:
		return p, fmt.Errorf("service level %d exceeds 15: %w", a.SL, ibv.ErrInvalidArgument)
	}
	// The initiator depth must not exceed the peer's responder resources
	// (an older HCA in a mixed fleet has fewer): it NAKs the excess READs.
	initRd := clampRd(a.MaxRdAtomic, lp.MaxInitRd)
	if remote.MaxDestRd > 0 {
		initRd = min(initRd, remote.MaxDestRd)
	}
	p = connParams{
		PathMTU:         mtuEnum(mtu),
		DestQPN:         remote.QPN,
		RqPSN:           remote.PSN,
		SqPSN:           localPSN,
		MaxDestRdAtomic: clampRd(a.MaxDestRd, lp.MaxRdAtom),
		MinRNRTimer:     a.MinRNRTimer,
		Timeout:         a.Timeout,
		RetryCnt:        a.RetryCnt,
		RNRRetry:        a.RNRRetry,
		MaxRdAtomic:     initRd,
		Port:            lp.Num,
		SL:              a.SL,
		TrafficClass:    a.TrafficCls,
	}
	if lp.Ethernet || lp.GRHRequired {
		if remote.GID == (ibv.GID{}) {
			return connParams{}, fmt.Errorf("peer sent a zero GID and the local port needs a GRH: %w", ibv.ErrInvalidArgument)
		}
		if lp.GIDIndex < 0 || lp.GIDIndex > 255 {
			return connParams{}, fmt.Errorf("local GID index %d: %w", lp.GIDIndex, ibv.ErrInvalidArgument)
		}
		p.IsGlobal = true
		p.DGID = remote.GID
		p.SGIDIndex = uint8(lp.GIDIndex)
		p.HopLimit = a.HopLimit
		if p.HopLimit == 0 {
			p.HopLimit = 64 // routable RoCE v2 needs a non-zero TTL
		}
	}
	if lp.Ethernet {
		return p, nil
	}
	if remote.LID == 0 || remote.LID >= 0xc000 {
		return connParams{}, fmt.Errorf("InfiniBand peer LID %#x is not a unicast LID: %w", remote.LID, ibv.ErrInvalidArgument)
	}
	p.DLID = remote.LID
	return p, nil
}

// clampRd limits a requested read depth to the device's; 0 requests the
// device maximum. A device limit of 0 (unknown) leaves the request as is,
// and the result is at least 1 so READs can be issued at all.
func clampRd(req uint8, dev int) uint8 {
	v := int(req)
	if v == 0 || (dev > 0 && v > dev) {
		v = dev
	}
	return uint8(max(1, min(v, 255)))
}

// WC opcodes of enum ibv_wc_opcode that pegad posts.
const (
	wcRDMAWrite = 1
	wcRDMARead  = 2
	wcBindMW    = 5
	wcLocalInv  = 6
)

// wcOpcode maps enum ibv_wc_opcode to the model's opcode. libibverbs
// defines the opcode only for successful completions; other values map to
// -1.
func wcOpcode(op int) ibv.Opcode {
	switch op {
	case wcRDMAWrite:
		return ibv.OpRDMAWrite
	case wcRDMARead:
		return ibv.OpRDMARead
	case wcBindMW:
		return ibv.OpBindMW
	case wcLocalInv:
		return ibv.OpLocalInv
	}
	return -1
}

// checkWRs validates a chain before it reaches C: the index of the first
// malformed work request and why, or -1.
func checkWRs(wrs []ibv.SendWR) (int, error) {
	for i, w := range wrs {
		switch {
		case w.Op != ibv.OpRDMARead && w.Op != ibv.OpRDMAWrite:
			return i, fmt.Errorf("work request %d: opcode %v: %w", i, w.Op, ibv.ErrInvalidArgument)
		case w.Length == 0:
			return i, fmt.Errorf("work request %d: zero length: %w", i, ibv.ErrInvalidArgument)
		}
	}
	return -1, nil
}
