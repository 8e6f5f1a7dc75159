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

static enum ibv_wc_status fk_bind(fk_qp *q, struct ibv_send_wr *wr) {
	fk_mw *w = (fk_mw *)wr->bind_mw.mw;
	const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
	// As rxe: the bind names the window by mw->rkey, which must be its
	// current key (the caller updates it after each bind).
	if (fk_find_mw(q->qp.pd, w->key) != w || w->mw.rkey != w->key || w->mw.type != IBV_MW_TYPE_2 || w->mr != NULL)
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

// fk_mw_execute runs a memory-window WR; -1 when wr is not one.
static int fk_mw_execute(fk_qp *q, struct ibv_send_wr *wr) {
	if (wr->opcode != IBV_WR_BIND_MW && wr->opcode != IBV_WR_LOCAL_INV)
		return -1;
	if (q->state == IBV_QPS_ERR)
		return IBV_WC_WR_FLUSH_ERR;
	return wr->opcode == IBV_WR_BIND_MW ? fk_bind(q, wr) : fk_local_inv(q, wr);
}
