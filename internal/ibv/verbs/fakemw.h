// Memory-window emulation of fakeverbs.c, included there (it shares the
// fake's tables, key counter and lock; not a translation unit of its own).
// Strict like mlx5, so the holder's use of windows is checked where rxe is
// lax (rxe does not enforce a window's bounds):
//   - ibv_alloc_mw(3): type 2 only here; the window belongs to its PD.
//   - ibv_post_send(3) IBV_WR_BIND_MW: the MR must have IBV_ACCESS_MW_BIND
//     and the range must lie in it; the new rkey keeps the window's index
//     (ibv_inc_rkey); a type-2 window that is still bound cannot be bound
//     again (ibv_bind_mw(3): invalidate first). Failures complete with
//     IBV_WC_MW_BIND_ERR.
//   - A type-2 window's rkey is valid only on the QP it was bound on, only
//     inside its range and access, and not after IBV_WR_LOCAL_INV or
//     ibv_dealloc_mw: a peer READ otherwise completes with
//     IBV_WC_REM_ACCESS_ERR.
//   - ibv_alloc_pd(3): ibv_dealloc_pd fails (EBUSY) while a window of the
//     PD is allocated.
// Faults, set by tests (pv_fake_mw_faults), model an HCA that is slow or
// failing; each is what the man pages allow, nothing a driver promises
// against:
//   - A delayed bind: the HCA has not processed the IBV_WR_BIND_MW yet. It
//     stays in the send queue (counted in max_send_wr), executes at its
//     moment (the window becomes valid then, over the range it names) and
//     completes; ibv_post_send(3) only queues the WR. Moving the QP to
//     ERROR flushes it first (IBV_WC_WR_FLUSH_ERR, nothing bound:
//     ibv_modify_qp(3)); destroying the QP drops it with its CQEs. A
//     window deallocated meanwhile is not found when it executes
//     (IBV_WC_MW_BIND_ERR, as rxe looks the window up by its rkey's index).
//   - A failed bind: it completes with the status set, binding nothing.
//   - A failed ibv_dealloc_mw(3): it returns the errno set, and the window
//     stays allocated and bound: READs through it still work (as after a
//     firmware command timeout, which leaves the key's state unknown).
// Caller holds fk_mu for everything below except alloc and dealloc.

typedef struct fk_mw {
	struct ibv_mw mw;
	fk_mr *mr;       // bound region; NULL when invalid (never bound, invalidated)
	uint32_t qpn;    // QP it was bound on
	uint64_t addr, len;
	int access;
	// key is the window's current rkey. mw.rkey stays as allocated: like
	// mlx5 and rxe, a bind posted on a QP does not update it, so the caller
	// must track the key it bound with (ibv_inc_rkey of the last one).
	uint32_t key;
} fk_mw;

static fk_mw *fk_mws[FK_MAX];
static uint32_t fk_next_mw = 1;

// The faults (pv_fake_mw_faults), guarded by fk_mu.
static uint64_t fk_bind_delay_ns; // > 0: binds execute this long after post; FK_NEVER: only a flush ends them
static int fk_bind_status;        // != 0: binds complete with this status
static int fk_dealloc_errno;      // != 0: ibv_dealloc_mw fails with it

#define FK_NEVER UINT64_MAX

// A bind the HCA has not processed yet (a delayed bind), in post order.
typedef struct fk_pbind {
	struct fk_pbind *next;
	struct ibv_send_wr wr; // a copy; wr.bind_mw.mw is not followed (it may be freed)
	uint32_t qpn, key;     // its QP, and the window's key when posted (names the window)
	uint32_t mwkey;        // mw->rkey when posted
	uint64_t due;
} fk_pbind;
static fk_pbind *fk_pbinds;

static void fk_complete(fk_qp *q, struct ibv_send_wr *wr, enum ibv_wc_status st);

// Window rkeys carry the top bit so they never meet an MR key.
#define FK_MW_KEY 0x80000000u

static struct ibv_mw *fk_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type) {
	if (type != IBV_MW_TYPE_2) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	fk_mw *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return NULL;
	pthread_mutex_lock(&fk_mu);
	w->mw.context = pd->context;
	w->mw.pd = pd;
	w->mw.type = type;
	w->mw.rkey = FK_MW_KEY | ((fk_next_mw++ & 0x7fffff) << 8);
	w->key = w->mw.rkey;
	int rc = fk_put((void **)fk_mws, w);
	pthread_mutex_unlock(&fk_mu);
	if (rc) {
		free(w);
		errno = rc;
		return NULL;
	}
	return &w->mw;
}

static int fk_dealloc_mw(struct ibv_mw *mw) {
	pthread_mutex_lock(&fk_mu);
	if (fk_dealloc_errno) {
		int rc = fk_dealloc_errno; // ibv_dealloc_mw(3): the errno; the window stays
		pthread_mutex_unlock(&fk_mu);
		return rc;
	}
	fk_del((void **)fk_mws, mw);
	pthread_mutex_unlock(&fk_mu);
	free(mw);
	return 0;
}

// fk_mr_has_mw: some window is bound over m (ibv_dereg_mr(3): EBUSY).
static int fk_mr_has_mw(fk_mr *m) {
	for (int i = 0; i < fk_hi; i++)
		if (fk_mws[i] && fk_mws[i]->mr == m)
			return 1;
	return 0;
}

static fk_mw *fk_find_mw(struct ibv_pd *pd, uint32_t rkey) {
	for (int i = 0; i < fk_hi; i++) {
		fk_mw *w = fk_mws[i];
		if (w && w->mw.pd == pd && w->key == rkey)
			return w;
	}
	return NULL;
}

// fk_mw_allows: a peer's access through responder QP r with a window key.
static int fk_mw_allows(fk_qp *r, uint32_t rkey, uint64_t addr, uint32_t len, int access) {
	fk_mw *w = fk_find_mw(r->qp.pd, rkey);
	if (w == NULL || w->mr == NULL || w->qpn != r->qp.qp_num)
		return 0;
	if (addr < w->addr || len > w->len || addr - w->addr > w->len - len)
		return 0;
	return (w->access & access) == access;
}

#define FK_MW_ACCESS (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

// fk_bind executes a bind of window w (NULL: not found) on q; mwkey is
// the window's mw->rkey as the WR carried it when posted (rxe copies it
// into the WQE).
static enum ibv_wc_status fk_bind(fk_qp *q, fk_mw *w, uint32_t mwkey, struct ibv_send_wr *wr) {
	const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
	if (fk_bind_status)
		return (enum ibv_wc_status)fk_bind_status;
	// As rxe: the bind names the window by mw->rkey, which must be its
	// current key (the caller updates it after each bind).
	if (w == NULL || fk_find_mw(q->qp.pd, w->key) != w || mwkey != w->key || w->mw.type != IBV_MW_TYPE_2 ||
	    w->mr != NULL)
		return IBV_WC_MW_BIND_ERR;
	// The new key keeps the index and must not be the current one (a
	// stale key must not come back valid).
	if ((wr->bind_mw.rkey & ~0xffu) != (w->key & ~0xffu) || wr->bind_mw.rkey == w->key)
		return IBV_WC_MW_BIND_ERR;
	fk_mr *m = NULL;
	for (int i = 0; i < fk_hi; i++)
		if (fk_mrs[i] && &fk_mrs[i]->mr == b->mr)
			m = fk_mrs[i];
	if (m == NULL || m->mr.pd != q->qp.pd || !(m->access & IBV_ACCESS_MW_BIND) ||
	    (b->mw_access_flags & ~FK_MW_ACCESS) != 0 || b->length == 0)
		return IBV_WC_MW_BIND_ERR;
	uint64_t base = (uint64_t)(uintptr_t)m->mr.addr;
	if (b->addr < base || b->length > m->mr.length || b->addr - base > m->mr.length - b->length)
		return IBV_WC_MW_BIND_ERR;
	w->mr = m;
	w->qpn = q->qp.qp_num;
	w->addr = b->addr;
	w->len = b->length;
	w->access = (int)b->mw_access_flags;
	w->key = wr->bind_mw.rkey;
	return IBV_WC_SUCCESS;
}

static enum ibv_wc_status fk_local_inv(fk_qp *q, struct ibv_send_wr *wr) {
	fk_mw *w = fk_find_mw(q->qp.pd, wr->invalidate_rkey);
	if (w == NULL || w->mr == NULL)
		return IBV_WC_MW_BIND_ERR;
	w->mr = NULL;
	return IBV_WC_SUCCESS;
}

// FK_DEFERRED: fk_mw_execute queued a delayed bind; it completes later.
#define FK_DEFERRED (-2)

// fk_defer queues bind wr of q until its moment (a delayed bind).
static int fk_defer(fk_qp *q, struct ibv_send_wr *wr) {
	fk_pbind *p = calloc(1, sizeof(*p));
	if (p == NULL)
		abort(); // losing a WR would hang its waiter
	p->wr = *wr;
	p->wr.next = NULL;
	p->qpn = q->qp.qp_num;
	p->key = ((fk_mw *)wr->bind_mw.mw)->key;
	p->mwkey = wr->bind_mw.mw->rkey;
	p->due = fk_bind_delay_ns == FK_NEVER ? FK_NEVER : fk_now() + fk_bind_delay_ns;
	fk_pbind **tail = &fk_pbinds;
	while (*tail)
		tail = &(*tail)->next;
	*tail = p;
	return FK_DEFERRED;
}

// fk_run_binds executes the delayed binds whose moment has come at now
// and completes them; with qpn set, it flushes every one of that QP
// (moved to ERROR) instead; with drop, it drops them (QP destroyed).
// Every entry point that could see a bind's effect (post, poll, the
// window census) runs it first, so a bind takes effect at its moment.
static void fk_run_binds(uint64_t now, uint32_t qpn, int drop) {
	for (fk_pbind **pp = &fk_pbinds; *pp;) {
		fk_pbind *p = *pp;
		int mine = qpn != 0 && p->qpn == qpn;
		if (!mine && (qpn != 0 || p->due > now)) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		fk_qp *q = fk_find_qp(p->qpn);
		if (q != NULL && !drop) {
			enum ibv_wc_status st = IBV_WC_WR_FLUSH_ERR;
			if (!mine && q->state != IBV_QPS_ERR)
				st = fk_bind(q, fk_find_mw(q->qp.pd, p->key), p->mwkey, &p->wr);
			if (st != IBV_WC_SUCCESS)
				q->state = IBV_QPS_ERR;
			fk_complete(q, &p->wr, st);
		}
		free(p);
	}
}

// fk_mw_execute runs a memory-window WR; -1 when wr is not one.
static int fk_mw_execute(fk_qp *q, struct ibv_send_wr *wr) {
	if (wr->opcode != IBV_WR_BIND_MW && wr->opcode != IBV_WR_LOCAL_INV)
		return -1;
	if (q->state == IBV_QPS_ERR)
		return IBV_WC_WR_FLUSH_ERR;
	if (wr->opcode == IBV_WR_LOCAL_INV)
		return fk_local_inv(q, wr);
	if (fk_bind_delay_ns)
		return fk_defer(q, wr);
	return fk_bind(q, (fk_mw *)wr->bind_mw.mw, wr->bind_mw.mw->rkey, wr);
}

// fk_mw_in_pd: a window of pd is allocated (ibv_dealloc_pd: EBUSY).
static int fk_mw_in_pd(struct ibv_pd *pd) {
	for (int i = 0; i < fk_hi; i++)
		if (fk_mws[i] && fk_mws[i]->mw.pd == pd)
			return 1;
	return 0;
}

void pv_fake_mw_faults(uint64_t bind_delay_ns, int bind_status, int dealloc_errno) {
	pthread_mutex_lock(&fk_mu);
	fk_bind_delay_ns = bind_delay_ns;
	fk_bind_status = bind_status;
	fk_dealloc_errno = dealloc_errno;
	pthread_mutex_unlock(&fk_mu);
}

// pv_fake_mws counts the allocated windows that are bound, and of those
// the usable ones: their QP exists and is in RTR or RTS, so a READ of its
// peer through them touches memory.
void pv_fake_mws(int *bound, int *usable) {
	pthread_mutex_lock(&fk_mu);
	fk_run_binds(fk_now(), 0, 0);
	*bound = 0, *usable = 0;
	for (int i = 0; i < fk_hi; i++) {
		fk_mw *w = fk_mws[i];
		if (w == NULL || w->mr == NULL)
			continue;
		(*bound)++;
		fk_qp *q = fk_find_qp(w->qpn);
		if (q != NULL && (q->state == IBV_QPS_RTR || q->state == IBV_QPS_RTS))
			(*usable)++;
	}
	pthread_mutex_unlock(&fk_mu);
}
