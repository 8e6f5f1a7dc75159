//go:build linux && cgo && !noverbs

package verbs

/*
#include <errno.h>
#include <string.h>
#include "shim.h"

// pv_mw_caps: type-2 memory windows are usable (ibv_query_device(3):
// IBV_DEVICE_MEM_WINDOW_TYPE_2B and max_mw).
static int pv_mw_caps(pv_lib *l, struct ibv_context *ctx, int *ok) {
	struct ibv_device_attr a;
	memset(&a, 0, sizeof(a));
	*ok = 0;
	int rc = l->query_device(ctx, &a);
	if (rc)
		return rc < 0 ? -rc : rc;
	*ok = a.max_mw > 0 && (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
	return 0;
}

static struct ibv_mw *pv_alloc_mw(struct ibv_pd *pd, int *err) {
	errno = 0;
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	*err = mw ? 0 : (errno ? errno : ENOMEM);
	return mw;
}

static int pv_dealloc_mw(struct ibv_mw *mw) {
	int rc = ibv_dealloc_mw(mw);
	return rc < 0 ? -rc : rc;
}

// pv_post_bind_mw posts IBV_WR_BIND_MW (ibv_post_send(3)) with the next
// rkey after cur (ibv_inc_rkey), returned in *rkey. cur is the key of the
// last bind, tracked by the caller: providers (rxe, mlx5) do not update
// mw->rkey for a bind posted on a QP, so rebinding from it reuses a key
// and rxe fails the bind (IBV_WC_MW_BIND_ERR).
static int pv_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t cur, struct ibv_mr *mr, uint64_t addr,
			   uint64_t len, unsigned access, uint64_t wr_id, unsigned flags, uint32_t *rkey) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(cur);
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	*rkey = wr.bind_mw.rkey;
	int rc = ibv_post_send(qp, &wr, &bad);
	// rxe's next bind names the window by mw->rkey, which must be the key
	// the kernel holds (rxe_bind_mw: mw->rkey != mw_rkey is EINVAL), so
	// it is the caller's to update for a bind posted on a QP.
	if (rc == 0)
		mw->rkey = wr.bind_mw.rkey;
	return rc < 0 ? -rc : rc;
}

static int pv_post_local_inv(struct ibv_qp *qp, uint32_t rkey, uint64_t wr_id, unsigned flags) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = flags;
	wr.invalidate_rkey = rkey;
	int rc = ibv_post_send(qp, &wr, &bad);
	return rc < 0 ? -rc : rc;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/pegaflow/pegad/internal/ibv"
)

var (
	_ ibv.MWPD = (*pd)(nil)
	_ ibv.MWQP = (*qp)(nil)
)

// memWindows reports whether ctx's device binds type-2 windows; an error
// of the query reads as no.
func (l *lib) memWindows(ctx *C.struct_ibv_context) bool {
	var ok C.int
	return C.pv_mw_caps(l.c, ctx, &ok) == 0 && ok != 0
}

// mw is a type-2 memory window of a PD.
type mw struct {
	pd *pd

	mu   sync.Mutex // guards w and rkey
	w    *C.struct_ibv_mw
	rkey uint32
}

var _ ibv.MW = (*mw)(nil)

func (p *pd) AllocMW() (ibv.MW, error) {
	if !p.dev.Info().MemWindows {
		return nil, fmt.Errorf("alloc mw on %s: no type-2 memory windows: %w", p.dev.name, ibv.ErrInvalidArgument)
	}
	pp, err := p.acquire()
	if err != nil {
		return nil, err
	}
	var errno C.int
	w := C.pv_alloc_mw(pp, &errno)
	if w == nil {
		p.release()
		return nil, verbsErr("ibv_alloc_mw", syscall.Errno(errno))
	}
	return &mw{pd: p, w: w, rkey: uint32(w.rkey)}, nil
}

func (m *mw) RKey() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rkey
}

func (m *mw) Dealloc() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.w == nil {
		return fmt.Errorf("dealloc mw: %w", ibv.ErrClosed)
	}
	if rc := C.pv_dealloc_mw(m.w); rc != 0 {
		return verbsErr("ibv_dealloc_mw", syscall.Errno(rc))
	}
	m.w = nil
	m.pd.release()
	return nil
}

// postable takes q's lock shared, as PostSend does, and checks the state.
func (q *qp) postable() error {
	if q.p == nil {
		return fmt.Errorf("post on qp %d: %w", q.qpn, ibv.ErrClosed)
	}
	if q.state != ibv.QPSRTS && q.state != ibv.QPSError {
		return fmt.Errorf("post on qp %d in state %v: %w", q.qpn, q.state, ibv.ErrInvalidState)
	}
	return nil
}

func signaledFlag(s bool) C.uint {
	if s {
		return C.uint(sendSignaled)
	}
	return 0
}

func (q *qp) PostBindMW(w ibv.MW, r ibv.MR, addr, length uint64, access ibv.Access, id uint64, signaled bool) (uint32, error) {
	vw, ok1 := w.(*mw)
	vr, ok2 := r.(*mr)
	if !ok1 || !ok2 || vw.pd != q.pd || vr.pd != q.pd {
		return 0, fmt.Errorf("bind mw on qp %d: window or region of another provider or PD: %w", q.qpn, ibv.ErrInvalidArgument)
	}
	if length == 0 || addr < vr.addr || length > vr.length || addr-vr.addr > vr.length-length {
		return 0, fmt.Errorf("bind mw on qp %d: [%#x,+%d) outside the region: %w", q.qpn, addr, length, ibv.ErrInvalidArgument)
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if err := q.postable(); err != nil {
		return 0, err
	}
	vw.mu.Lock()
	defer vw.mu.Unlock()
	vr.mu.Lock()
	defer vr.mu.Unlock()
	if vw.w == nil || vr.m == nil {
		return 0, fmt.Errorf("bind mw on qp %d: %w", q.qpn, ibv.ErrClosed)
	}
	var rkey C.uint32_t
	if rc := C.pv_post_bind_mw(q.p, vw.w, C.uint32_t(vw.rkey), vr.m, C.uint64_t(addr), C.uint64_t(length), C.uint(access),
		C.uint64_t(id), signaledFlag(signaled), &rkey); rc != 0 {
		return 0, fmt.Errorf("bind mw on qp %d: %w", q.qpn, verbsErr("ibv_post_send", syscall.Errno(rc)))
	}
	vw.rkey = uint32(rkey)
	return uint32(rkey), nil
}

func (q *qp) PostLocalInv(rkey uint32, id uint64, signaled bool) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if err := q.postable(); err != nil {
		return err
	}
	if rc := C.pv_post_local_inv(q.p, C.uint32_t(rkey), C.uint64_t(id), signaledFlag(signaled)); rc != 0 {
		return fmt.Errorf("local inv on qp %d: %w", q.qpn, verbsErr("ibv_post_send", syscall.Errno(rc)))
	}
	return nil
}
