//go:build linux && cgo && !noverbs

// A loopback stand-in for libibverbs, used only by this package's tests so
// that the Go/C glue (object lifetimes, chain building, completion
// conversion, the context-op dispatch of ibv_post_send, ibv_poll_cq and
// ibv_query_port) runs on hosts without RDMA. It is not an RDMA
// implementation: work requests execute at post time by memcpy between MRs
// of one process, with an RC QP's checks (rkey/lkey, bounds, access, queue
// depth, states, flush after an error, RETRY_EXC_ERR toward a destroyed
// peer). One mutex serializes it.

#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define FK_MAX 4096

typedef struct fk_mr {
	struct ibv_mr mr;
	int access;
} fk_mr;

typedef struct fk_cq {
	struct ibv_cq cq;
	int cap, head, count;
	struct ibv_wc *ring;
} fk_cq;

typedef struct fk_qp {
	struct ibv_qp qp;
	int state;
	uint32_t dest, max_send_wr, outstanding;
} fk_qp;

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static fk_mr *fk_mrs[FK_MAX];
static fk_qp *fk_qps[FK_MAX];
static uint32_t fk_next_key = 0x100, fk_next_qpn = 0x40;
static struct ibv_device fk_dev;
static pv_lib fk_lib;

static int fk_hi; // tables are used below this index (scans stop there)

static int fk_put(void **tab, void *p) {
	for (int i = 0; i < FK_MAX; i++)
		if (tab[i] == NULL) {
			tab[i] = p;
			if (i >= fk_hi)
				fk_hi = i + 1;
			return 0;
		}
	return ENOMEM;
}

static void fk_del(void **tab, void *p) {
	for (int i = 0; i < fk_hi; i++)
		if (tab[i] == p)
			tab[i] = NULL;
}

static struct ibv_device **fk_get_device_list(int *num) {
	struct ibv_device **l = calloc(2, sizeof(*l));
	if (l == NULL)
		return NULL;
	strcpy(fk_dev.name, "pegadfake0");
	l[0] = &fk_dev;
	if (num)
		*num = 1;
	return l;
}

static void fk_free_device_list(struct ibv_device **l) { free(l); }

static const char *fk_get_device_name(struct ibv_device *d) { return d->name; }

static int fk_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len) {
	(void)ctx;
	if (port != 1)
		return EINVAL;
	memset(a, 0, len);
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_1024;
	a->gid_tbl_len = 4;
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

// GID 0: link-local RoCE v1; GID 1: IPv4-mapped 10.0.0.5 RoCE v2; others empty.
static int fk_gid(int idx, uint8_t *raw, uint32_t *type) {
	memset(raw, 0, 16);
	switch (idx) {
	case 0:
		raw[0] = 0xfe, raw[1] = 0x80, raw[15] = 1;
		*type = IBV_GID_TYPE_ROCE_V1;
		return 0;
	case 1:
		raw[10] = 0xff, raw[11] = 0xff, raw[12] = 10, raw[15] = 5;
		*type = IBV_GID_TYPE_ROCE_V2;
		return 0;
	}
	return ENODATA;
}

static int fk_query_gid(struct ibv_context *ctx, uint8_t port, int idx, union ibv_gid *g) {
	uint32_t t;
	(void)ctx, (void)port;
	return fk_gid(idx, g->raw, &t) ? -1 : 0;
}

static int fk_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t idx,
			   struct ibv_gid_entry *e, uint32_t flags, size_t size) {
	(void)ctx, (void)flags, (void)size;
	e->gid_index = idx;
	e->port_num = port;
	return fk_gid((int)idx, e->gid.raw, &e->gid_type);
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

static struct ibv_context *fk_open_device(struct ibv_device *d) {
	struct verbs_context *v = calloc(1, sizeof(*v));
	if (v == NULL)
		return NULL;
	v->sz = sizeof(*v);
	v->query_port = fk_query_port;
	v->context.device = d;
	v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	v->context.ops.post_send = fk_post_send;
	v->context.ops.poll_cq = fk_poll_cq;
	return &v->context;
}

static int fk_close_device(struct ibv_context *ctx) {
	free(verbs_get_ctx(ctx));
	return 0;
}

static int fk_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	(void)ctx;
	memset(a, 0, sizeof(*a));
	a->max_qp_wr = 16384;
	a->max_sge = 30;
	a->max_cqe = 1 << 16;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static struct ibv_pd *fk_alloc_pd(struct ibv_context *ctx) {
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (pd)
		pd->context = ctx;
	return pd;
}

static int fk_dealloc_pd(struct ibv_pd *pd) {
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < fk_hi; i++)
		if ((fk_mrs[i] && fk_mrs[i]->mr.pd == pd) || (fk_qps[i] && fk_qps[i]->qp.pd == pd)) {
			pthread_mutex_unlock(&fk_mu);
			return EBUSY;
		}
	pthread_mutex_unlock(&fk_mu);
	free(pd);
	return 0;
}

static struct ibv_mr *fk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	fk_mr *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return NULL;
	pthread_mutex_lock(&fk_mu);
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.lkey = fk_next_key++;
	m->mr.rkey = fk_next_key++;
	m->access = access;
	int rc = fk_put((void **)fk_mrs, m);
	pthread_mutex_unlock(&fk_mu);
	if (rc) {
		free(m);
		errno = rc;
		return NULL;
	}
	return &m->mr;
}

static int fk_dereg_mr(struct ibv_mr *mr) {
	pthread_mutex_lock(&fk_mu);
	fk_del((void **)fk_mrs, mr);
	pthread_mutex_unlock(&fk_mu);
	free(mr);
	return 0;
}

static struct ibv_cq *fk_create_cq(struct ibv_context *ctx, int cqe, void *cq_ctx,
				   struct ibv_comp_channel *ch, int vector) {
	(void)cq_ctx, (void)ch, (void)vector;
	fk_cq *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->ring = calloc((size_t)cqe, sizeof(*c->ring));
	if (c->ring == NULL) {
		free(c);
		return NULL;
	}
	c->cap = cqe;
	c->cq.context = ctx;
	c->cq.cqe = cqe;
	return &c->cq;
}

static int fk_destroy_cq(struct ibv_cq *cq) {
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < fk_hi; i++)
		if (fk_qps[i] && fk_qps[i]->qp.send_cq == cq) {
			pthread_mutex_unlock(&fk_mu);
			return EBUSY;
		}
	pthread_mutex_unlock(&fk_mu);
	fk_cq *c = (fk_cq *)cq;
	free(c->ring);
	free(c);
	return 0;
}

static struct ibv_qp *fk_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
	if (a->qp_type != IBV_QPT_RC || a->send_cq == NULL || a->cap.max_send_wr == 0) {
		errno = EINVAL;
		return NULL;
	}
	fk_qp *q = calloc(1, sizeof(*q));
	if (q == NULL)
		return NULL;
	pthread_mutex_lock(&fk_mu);
	q->qp.context = pd->context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.qp_num = fk_next_qpn++;
	q->state = IBV_QPS_RESET;
	q->max_send_wr = a->cap.max_send_wr;
	int rc = fk_put((void **)fk_qps, q);
	pthread_mutex_unlock(&fk_mu);
	if (rc) {
		free(q);
		errno = rc;
		return NULL;
	}
	return &q->qp;
}

// fk_modify_qp follows the RC state machine and checks the attributes
// pegad must set on each transition.
static int fk_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
	fk_qp *q = (fk_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&fk_mu);
	if (!(mask & IBV_QP_STATE)) {
		rc = EINVAL;
	} else if (a->qp_state == IBV_QPS_ERR) {
		q->state = IBV_QPS_ERR;
	} else if (a->qp_state == IBV_QPS_INIT) {
		int need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		if (q->state != IBV_QPS_RESET || (mask & need) != need || a->port_num != 1)
			rc = EINVAL;
		else
			q->state = IBV_QPS_INIT;
	} else if (a->qp_state == IBV_QPS_RTR) {
		int need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		if (q->state != IBV_QPS_INIT || (mask & need) != need || a->path_mtu < IBV_MTU_256 ||
		    a->path_mtu > IBV_MTU_1024 || !a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= 4 ||
		    a->ah_attr.grh.hop_limit == 0 || a->ah_attr.port_num != 1 || a->max_dest_rd_atomic > 16)
			rc = EINVAL;
		else {
			q->dest = a->dest_qp_num;
			q->state = IBV_QPS_RTR;
		}
	} else if (a->qp_state == IBV_QPS_RTS) {
		int need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			   IBV_QP_MAX_QP_RD_ATOMIC;
		if (q->state != IBV_QPS_RTR || (mask & need) != need || a->max_rd_atomic > 16 ||
		    a->max_rd_atomic == 0)
			rc = EINVAL;
		else
			q->state = IBV_QPS_RTS;
	} else {
		rc = EINVAL;
	}
	pthread_mutex_unlock(&fk_mu);
	return rc;
}

static int fk_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init) {
	(void)mask, (void)init;
	pthread_mutex_lock(&fk_mu);
	a->qp_state = ((fk_qp *)qp)->state;
	pthread_mutex_unlock(&fk_mu);
	return 0;
}

static fk_qp *fk_find_qp(uint32_t qpn) {
	for (int i = 0; i < fk_hi; i++)
		if (fk_qps[i] && fk_qps[i]->qp.qp_num == qpn)
			return fk_qps[i];
	return NULL;
}

static int fk_destroy_qp(struct ibv_qp *qp) {
	fk_qp *q = (fk_qp *)qp;
	pthread_mutex_lock(&fk_mu);
	fk_del((void **)fk_qps, q);
	// Like mlx5, drop the destroyed QP's entries from its CQ.
	fk_cq *c = (fk_cq *)q->qp.send_cq;
	int kept = 0;
	for (int i = 0; i < c->count; i++) {
		struct ibv_wc w = c->ring[(c->head + i) % c->cap];
		if (w.qp_num != q->qp.qp_num)
			c->ring[(c->head + kept++) % c->cap] = w;
	}
	c->count = kept;
	pthread_mutex_unlock(&fk_mu);
	free(q);
	return 0;
}

static fk_mr *fk_find_mr(struct ibv_pd *pd, uint32_t key, int remote, uint64_t addr, uint32_t len, int access) {
	for (int i = 0; i < fk_hi; i++) {
		fk_mr *m = fk_mrs[i];
		if (m == NULL || m->mr.pd != pd || (remote ? m->mr.rkey : m->mr.lkey) != key)
			continue;
		uint64_t base = (uint64_t)(uintptr_t)m->mr.addr;
		if (addr < base || len > m->mr.length || addr - base > m->mr.length - len)
			return NULL;
		return (m->access & access) == access ? m : NULL;
	}
	return NULL;
}

static void fk_complete(fk_qp *q, struct ibv_send_wr *wr, enum ibv_wc_status st) {
	fk_cq *c = (fk_cq *)q->qp.send_cq;
	if (st == IBV_WC_SUCCESS && !(wr->send_flags & IBV_SEND_SIGNALED)) {
		q->outstanding--;
		return;
	}
	if (c->count == c->cap)
		return; // overrun: a real CQ raises an async error
	struct ibv_wc *w = &c->ring[(c->head + c->count++) % c->cap];
	memset(w, 0, sizeof(*w));
	w->wr_id = wr->wr_id;
	w->status = st;
	w->qp_num = q->qp.qp_num;
	w->opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	w->byte_len = st == IBV_WC_SUCCESS ? wr->sg_list[0].length : 0;
	if (st != IBV_WC_SUCCESS) {
		w->opcode = 0xff; // undefined for failed completions
		w->vendor_err = 0x99;
	}
}

static enum ibv_wc_status fk_execute(fk_qp *q, struct ibv_send_wr *wr) {
	if (q->state == IBV_QPS_ERR)
		return IBV_WC_WR_FLUSH_ERR;
	fk_qp *r = fk_find_qp(q->dest);
	if (r == NULL || r->dest != q->qp.qp_num || (r->state != IBV_QPS_RTR && r->state != IBV_QPS_RTS))
		return IBV_WC_RETRY_EXC_ERR;
	int read = wr->opcode == IBV_WR_RDMA_READ;
	struct ibv_sge *s = &wr->sg_list[0];
	if (wr->num_sge != 1 || fk_find_mr(q->qp.pd, s->lkey, 0, s->addr, s->length,
					     read ? IBV_ACCESS_LOCAL_WRITE : 0) == NULL)
		return IBV_WC_LOC_PROT_ERR;
	if (fk_find_mr(r->qp.pd, wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr, s->length,
		       read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE) == NULL)
		return IBV_WC_REM_ACCESS_ERR;
	void *l = (void *)(uintptr_t)s->addr, *rm = (void *)(uintptr_t)wr->wr.rdma.remote_addr;
	if (read)
		memmove(l, rm, s->length);
	else
		memmove(rm, l, s->length);
	return IBV_WC_SUCCESS;
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	fk_qp *q = (fk_qp *)qp;
	pthread_mutex_lock(&fk_mu);
	for (; wr != NULL; wr = wr->next) {
		int rc = 0;
		if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR)
			rc = EINVAL;
		else if (q->outstanding >= q->max_send_wr)
			rc = ENOMEM;
		else if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE)
			rc = EINVAL;
		if (rc) {
			*bad = wr;
			pthread_mutex_unlock(&fk_mu);
			return rc;
		}
		q->outstanding++;
		enum ibv_wc_status st = fk_execute(q, wr);
		if (st != IBV_WC_SUCCESS)
			q->state = IBV_QPS_ERR;
		fk_complete(q, wr, st);
	}
	pthread_mutex_unlock(&fk_mu);
	return 0;
}

static int fk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	fk_cq *c = (fk_cq *)cq;
	int k = 0;
	pthread_mutex_lock(&fk_mu);
	for (; k < n && c->count > 0; k++) {
		wc[k] = c->ring[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
		fk_qp *q = fk_find_qp(wc[k].qp_num);
		if (q && q->outstanding > 0)
			q->outstanding--;
	}
	pthread_mutex_unlock(&fk_mu);
	return k;
}

pv_lib *pv_fake_lib(void) {
	pthread_mutex_lock(&fk_mu);
	if (fk_lib.get_device_list == NULL) {
		fk_lib.get_device_list = fk_get_device_list;
		fk_lib.free_device_list = fk_free_device_list;
		fk_lib.get_device_name = fk_get_device_name;
		fk_lib.open_device = fk_open_device;
		fk_lib.close_device = fk_close_device;
		fk_lib.query_device = fk_query_device;
		fk_lib.query_port_compat = NULL; // the context op must be used
		fk_lib.query_gid = fk_query_gid;
		fk_lib.query_gid_ex = fk_query_gid_ex;
		fk_lib.alloc_pd = fk_alloc_pd;
		fk_lib.dealloc_pd = fk_dealloc_pd;
		fk_lib.reg_mr = fk_reg_mr;
		fk_lib.dereg_mr = fk_dereg_mr;
		fk_lib.create_cq = fk_create_cq;
		fk_lib.destroy_cq = fk_destroy_cq;
		fk_lib.create_qp = fk_create_qp;
		fk_lib.modify_qp = fk_modify_qp;
		fk_lib.query_qp = fk_query_qp;
		fk_lib.destroy_qp = fk_destroy_qp;
	}
	pthread_mutex_unlock(&fk_mu);
	return &fk_lib;
}
