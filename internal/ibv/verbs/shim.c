//go:build linux && cgo && !noverbs

#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// status normalizes a verbs return code: libibverbs returns 0, a positive
// errno, or -1 with errno set (and some providers -errno).
static int status(int rc) {
	if (rc == 0)
		return 0;
	if (rc > 0)
		return rc;
	if (rc == -1 && errno > 0)
		return errno;
	return rc == -1 ? EIO : -rc;
}

static int pointer_errno(void) { return errno > 0 ? errno : EIO; }

int pv_open(const char *name, pv_lib **out, char *err, size_t errlen) {
	dlerror();
	void *h = dlopen(name, RTLD_NOW);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	pv_lib *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		snprintf(err, errlen, "out of memory");
		dlclose(h);
		return 1;
	}
	l->handle = h;
	// dlsym returns the default symbol version (IBVERBS_1.1 for the
	// classic verbs), the one a program linked today would bind.
#define PV_SYM(field, sym, required)                                     \
	do {                                                              \
		*(void **)(&l->field) = dlsym(h, sym);                    \
		if (l->field == NULL && (required)) {                     \
			snprintf(err, errlen, "%s", sym);                 \
			goto missing;                                     \
		}                                                         \
	} while (0)
	PV_SYM(get_device_list, "ibv_get_device_list", 1);
	PV_SYM(free_device_list, "ibv_free_device_list", 1);
	PV_SYM(get_device_name, "ibv_get_device_name", 1);
	PV_SYM(open_device, "ibv_open_device", 1);
	PV_SYM(close_device, "ibv_close_device", 1);
	PV_SYM(query_device, "ibv_query_device", 1);
	PV_SYM(query_port_compat, "ibv_query_port", 1);
	PV_SYM(query_gid, "ibv_query_gid", 1);
	PV_SYM(query_gid_ex, "_ibv_query_gid_ex", 0);
	PV_SYM(alloc_pd, "ibv_alloc_pd", 1);
	PV_SYM(dealloc_pd, "ibv_dealloc_pd", 1);
	PV_SYM(reg_mr, "ibv_reg_mr", 1);
	PV_SYM(reg_mr_iova2, "ibv_reg_mr_iova2", 0);
	PV_SYM(dereg_mr, "ibv_dereg_mr", 1);
	PV_SYM(create_cq, "ibv_create_cq", 1);
	PV_SYM(destroy_cq, "ibv_destroy_cq", 1);
	PV_SYM(create_comp_channel, "ibv_create_comp_channel", 1);
	PV_SYM(destroy_comp_channel, "ibv_destroy_comp_channel", 1);
	PV_SYM(get_cq_event, "ibv_get_cq_event", 1);
	PV_SYM(ack_cq_events, "ibv_ack_cq_events", 1);
	PV_SYM(get_async_event, "ibv_get_async_event", 1);
	PV_SYM(ack_async_event, "ibv_ack_async_event", 1);
	PV_SYM(create_qp, "ibv_create_qp", 1);
	PV_SYM(modify_qp, "ibv_modify_qp", 1);
	PV_SYM(query_qp, "ibv_query_qp", 1);
	PV_SYM(destroy_qp, "ibv_destroy_qp", 1);
#undef PV_SYM
	*out = l;
	return 0;
missing:
	free(l);
	dlclose(h);
	return 2;
}

struct ibv_device **pv_get_device_list(pv_lib *l, int *num, int *err) {
	errno = 0;
	struct ibv_device **r = l->get_device_list(num);
	*err = r == NULL ? pointer_errno() : 0;
	return r;
}

struct ibv_context *pv_open_device(pv_lib *l, struct ibv_device *dev, int *err) {
	errno = 0;
	struct ibv_context *r = l->open_device(dev);
	*err = r == NULL ? pointer_errno() : 0;
	return r;
}

void pv_free_device_list(pv_lib *l, struct ibv_device **list) { l->free_device_list(list); }

const char *pv_get_device_name(pv_lib *l, struct ibv_device *dev) {
	const char *n = l->get_device_name(dev);
	return n ? n : "";
}

int pv_close_device(pv_lib *l, struct ibv_context *ctx) {
	errno = 0;
	return status(l->close_device(ctx));
}

int pv_dealloc_pd(pv_lib *l, struct ibv_pd *pd) {
	errno = 0;
	return status(l->dealloc_pd(pd));
}

int pv_dereg_mr(pv_lib *l, struct ibv_mr *mr) {
	errno = 0;
	return status(l->dereg_mr(mr));
}

int pv_destroy_cq(pv_lib *l, struct ibv_cq *cq) {
	errno = 0;
	return status(l->destroy_cq(cq));
}

int pv_destroy_qp(pv_lib *l, struct ibv_qp *qp) {
	errno = 0;
	return status(l->destroy_qp(qp));
}

int pv_query_device(pv_lib *l, struct ibv_context *ctx, pv_devattr *out) {
	struct ibv_device_attr a;
	memset(&a, 0, sizeof(a));
	errno = 0;
	int rc = status(l->query_device(ctx, &a));
	if (rc)
		return rc;
	out->max_qp_wr = a.max_qp_wr;
	out->max_sge = a.max_sge;
	out->max_cq = a.max_cq;
	out->max_cqe = a.max_cqe;
	out->max_qp = a.max_qp;
	out->max_mr = a.max_mr;
	out->max_qp_rd_atom = a.max_qp_rd_atom;
	out->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	out->max_mr_size = a.max_mr_size;
	out->phys_port_cnt = a.phys_port_cnt;
	return 0;
}

// pv_query_port does what verbs.h's static inline ___ibv_query_port does:
// the extended context op with the full struct when the provider has one,
// else the exported compat entry point (which fills a prefix of it).
int pv_query_port(pv_lib *l, struct ibv_context *ctx, uint8_t port, pv_portattr *out) {
	struct ibv_port_attr a;
	memset(&a, 0, sizeof(a));
	errno = 0;
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	int rc;
	if (vctx != NULL)
		rc = status(vctx->query_port(ctx, port, &a, sizeof(a)));
	else
		rc = status(l->query_port_compat(ctx, port, &a));
	if (rc)
		return rc;
	out->state = a.state;
	out->max_mtu = a.max_mtu;
	out->active_mtu = a.active_mtu;
	out->gid_tbl_len = a.gid_tbl_len;
	out->lid = a.lid;
	out->link_layer = a.link_layer;
	out->flags = a.flags;
	out->pkey_tbl_len = a.pkey_tbl_len;
	return 0;
}

int pv_query_gid(pv_lib *l, struct ibv_context *ctx, uint8_t port, int idx,
		 uint8_t gid[16], int *type) {
	errno = 0;
	if (l->query_gid_ex != NULL) {
		struct ibv_gid_entry e;
		memset(&e, 0, sizeof(e));
		int rc = status(l->query_gid_ex(ctx, port, (uint32_t)idx, &e, 0, sizeof(e)));
		if (rc == 0) {
			memcpy(gid, e.gid.raw, 16);
			*type = (int)e.gid_type;
			return 0;
		}
		if (rc != EOPNOTSUPP && rc != ENOSYS)
			return rc; // ENODATA: an empty entry
		errno = 0;
	}
	union ibv_gid g;
	memset(&g, 0, sizeof(g));
	int rc = status(l->query_gid(ctx, port, idx, &g));
	if (rc)
		return rc;
	memcpy(gid, g.raw, 16);
	*type = -1;
	return 0;
}

struct ibv_pd *pv_alloc_pd(pv_lib *l, struct ibv_context *ctx, int *err) {
	errno = 0;
	struct ibv_pd *r = l->alloc_pd(ctx);
	*err = r == NULL ? pointer_errno() : 0;
	return r;
}

struct ibv_mr *pv_reg_mr(pv_lib *l, struct ibv_pd *pd, uintptr_t addr, size_t len,
			 int access, int *err) {
	errno = 0;
	struct ibv_mr *r;
	if ((access & IBV_ACCESS_OPTIONAL_RANGE) && l->reg_mr_iova2 != NULL)
		r = l->reg_mr_iova2(pd, (void *)addr, len, (uint64_t)addr, (unsigned int)access);
	else
		r = l->reg_mr(pd, (void *)addr, len, access & ~IBV_ACCESS_OPTIONAL_RANGE);
	*err = r == NULL ? pointer_errno() : 0;
	return r;
}

struct ibv_cq *pv_create_cq(pv_lib *l, struct ibv_context *ctx, int depth,
			    int vector, struct ibv_comp_channel **chp, int *gofd, int *err) {
	errno = 0;
	struct ibv_comp_channel *ch = l->create_comp_channel(ctx);
	if (ch == NULL) {
		*err = pointer_errno();
		return NULL;
	}
	int flags = fcntl(ch->fd, F_GETFL);
	int fd = -1;
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
	    (fd = fcntl(ch->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		*err = pointer_errno();
		l->destroy_comp_channel(ch);
		return NULL;
	}
	errno = 0;
	struct ibv_cq *r = l->create_cq(ctx, depth, NULL, ch, vector);
	if (r == NULL) {
		*err = pointer_errno();
		close(fd);
		l->destroy_comp_channel(ch);
		return NULL;
	}
	*err = 0;
	*chp = ch;
	*gofd = fd;
	return r;
}

int pv_async_fd(struct ibv_context *ctx) {
	int flags = fcntl(ctx->async_fd, F_GETFL);
	if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -pointer_errno();
	int fd = fcntl(ctx->async_fd, F_DUPFD_CLOEXEC, 0);
	return fd < 0 ? -pointer_errno() : fd;
}

int pv_get_async_event(pv_lib *l, struct ibv_context *ctx, int *type, int *port) {
	struct ibv_async_event ev;
	memset(&ev, 0, sizeof(ev));
	errno = 0;
	if (l->get_async_event(ctx, &ev) != 0) {
		int e = errno;
		return e == EWOULDBLOCK ? EAGAIN : (e > 0 ? e : EIO);
	}
	*type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		*port = ev.element.port_num;
		break;
	default:
		*port = 0;
	}
	// ibv_get_async_event(3): every event must be acked, and destroying
	// the object it names waits for that.
	l->ack_async_event(&ev);
	return 0;
}

int pv_destroy_comp_channel(pv_lib *l, struct ibv_comp_channel *ch) {
	errno = 0;
	return status(l->destroy_comp_channel(ch));
}

int pv_req_notify_cq(struct ibv_cq *cq) {
	errno = 0;
	return status(ibv_req_notify_cq(cq, 0));
}

int pv_get_cq_event(pv_lib *l, struct ibv_comp_channel *ch) {
	struct ibv_cq *cq = NULL;
	void *cq_ctx = NULL;
	errno = 0;
	if (l->get_cq_event(ch, &cq, &cq_ctx) != 0) {
		int e = errno;
		return e == EWOULDBLOCK ? EAGAIN : (e > 0 ? e : EIO);
	}
	(void)cq; // one CQ per channel: the caller acks it, in batches
	return 0;
}

void pv_ack_cq_events(pv_lib *l, struct ibv_cq *cq, unsigned int n) {
	l->ack_cq_events(cq, n);
}

struct ibv_qp *pv_create_qp(pv_lib *l, struct ibv_pd *pd, struct ibv_cq *cq,
			    uint32_t max_send_wr, uint32_t max_recv_wr,
			    uint32_t max_send_sge, int *err) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_recv_sge = 1;
	errno = 0;
	struct ibv_qp *r = l->create_qp(pd, &a);
	*err = r == NULL ? pointer_errno() : 0;
	return r;
}

int pv_qp_init(pv_lib *l, struct ibv_qp *qp, uint8_t port, uint16_t pkey_index) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = pkey_index;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	errno = 0;
	return status(l->modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

void pv_fill_rtr(const pv_conn *p, struct ibv_qp_attr *a, int *mask) {
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_RTR;
	a->path_mtu = (enum ibv_mtu)p->path_mtu;
	a->dest_qp_num = p->dest_qpn;
	a->rq_psn = p->rq_psn;
	a->max_dest_rd_atomic = p->max_dest_rd_atomic;
	a->min_rnr_timer = p->min_rnr_timer;
	a->ah_attr.port_num = p->port;
	a->ah_attr.sl = p->sl;
	a->ah_attr.src_path_bits = 0;
	a->ah_attr.dlid = p->dlid; // 0 on RoCE; InfiniBand routes by it, with or without a GRH
	if (p->is_global) {
		a->ah_attr.is_global = 1;
		memcpy(a->ah_attr.grh.dgid.raw, p->dgid, 16);
		a->ah_attr.grh.sgid_index = p->sgid_index;
		a->ah_attr.grh.hop_limit = p->hop_limit;
		a->ah_attr.grh.traffic_class = p->traffic_class;
		a->ah_attr.grh.flow_label = 0;
	}
	*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

void pv_fill_rts(const pv_conn *p, struct ibv_qp_attr *a, int *mask) {
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_RTS;
	a->timeout = p->timeout;
	a->retry_cnt = p->retry_cnt;
	a->rnr_retry = p->rnr_retry;
	a->sq_psn = p->sq_psn;
	a->max_rd_atomic = p->max_rd_atomic;
	*mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		IBV_QP_MAX_QP_RD_ATOMIC;
}

void pv_conn_readback(const pv_conn *in, pv_conn *rtr, int *rtr_mask, pv_conn *rts, int *rts_mask) {
	struct ibv_qp_attr a;
	pv_fill_rtr(in, &a, rtr_mask);
	memset(rtr, 0, sizeof(*rtr));
	rtr->path_mtu = a.path_mtu;
	rtr->dest_qpn = a.dest_qp_num;
	rtr->rq_psn = a.rq_psn;
	rtr->max_dest_rd_atomic = a.max_dest_rd_atomic;
	rtr->min_rnr_timer = a.min_rnr_timer;
	rtr->port = a.ah_attr.port_num;
	rtr->sl = a.ah_attr.sl;
	rtr->is_global = a.ah_attr.is_global;
	rtr->dlid = a.ah_attr.dlid;
	memcpy(rtr->dgid, a.ah_attr.grh.dgid.raw, 16);
	rtr->sgid_index = a.ah_attr.grh.sgid_index;
	rtr->hop_limit = a.ah_attr.grh.hop_limit;
	rtr->traffic_class = a.ah_attr.grh.traffic_class;
	// Fields RTR must not set read back as what the attr holds (zero).
	rtr->sq_psn = a.sq_psn;
	rtr->timeout = a.timeout;
	rtr->retry_cnt = a.retry_cnt;
	rtr->rnr_retry = a.rnr_retry;
	rtr->max_rd_atomic = a.max_rd_atomic;

	pv_fill_rts(in, &a, rts_mask);
	memset(rts, 0, sizeof(*rts));
	rts->timeout = a.timeout;
	rts->retry_cnt = a.retry_cnt;
	rts->rnr_retry = a.rnr_retry;
	rts->sq_psn = a.sq_psn;
	rts->max_rd_atomic = a.max_rd_atomic;
	rts->path_mtu = a.path_mtu;
	rts->dest_qpn = a.dest_qp_num;
}

int pv_qp_rtr(pv_lib *l, struct ibv_qp *qp, const pv_conn *p) {
	struct ibv_qp_attr a;
	int mask;
	pv_fill_rtr(p, &a, &mask);
	errno = 0;
	return status(l->modify_qp(qp, &a, mask));
}

int pv_qp_rts(pv_lib *l, struct ibv_qp *qp, const pv_conn *p) {
	struct ibv_qp_attr a;
	int mask;
	pv_fill_rts(p, &a, &mask);
	errno = 0;
	return status(l->modify_qp(qp, &a, mask));
}

int pv_qp_to_error(pv_lib *l, struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	errno = 0;
	return status(l->modify_qp(qp, &a, IBV_QP_STATE));
}

int pv_qp_state(pv_lib *l, struct ibv_qp *qp, int *state) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	memset(&a, 0, sizeof(a));
	memset(&init, 0, sizeof(init));
	errno = 0;
	int rc = status(l->query_qp(qp, &a, IBV_QP_STATE, &init));
	if (rc == 0)
		*state = a.qp_state;
	return rc;
}

int pv_post_send(struct ibv_qp *qp, const pv_wr *w, int n, int *bad) {
	struct ibv_send_wr wrs[PV_CHAIN];
	struct ibv_sge sges[PV_CHAIN];
	*bad = -1;
	for (int base = 0; base < n; base += PV_CHAIN) {
		int m = n - base < PV_CHAIN ? n - base : PV_CHAIN;
		memset(wrs, 0, sizeof(wrs[0]) * m);
		for (int i = 0; i < m; i++) {
			const pv_wr *x = &w[base + i];
			sges[i].addr = x->laddr;
			sges[i].length = x->len;
			sges[i].lkey = x->lkey;
			wrs[i].wr_id = x->wr_id;
			wrs[i].sg_list = &sges[i];
			wrs[i].num_sge = 1;
			wrs[i].opcode = (enum ibv_wr_opcode)x->opcode;
			wrs[i].send_flags = x->flags;
			wrs[i].wr.rdma.remote_addr = x->raddr;
			wrs[i].wr.rdma.rkey = x->rkey;
			wrs[i].next = i + 1 < m ? &wrs[i + 1] : NULL;
		}
		struct ibv_send_wr *badwr = NULL;
		errno = 0;
		int rc = status(ibv_post_send(qp, wrs, &badwr));
		if (rc) {
			if (badwr >= wrs && badwr < wrs + m)
				*bad = base + (int)(badwr - wrs);
			else
				*bad = base; // nothing of this chain is known to be posted
			return rc;
		}
	}
	return 0;
}

int pv_poll_cq(struct ibv_cq *cq, int n, pv_wc *out) {
	struct ibv_wc wc[PV_CHAIN];
	int total = 0;
	while (total < n) {
		int m = n - total < PV_CHAIN ? n - total : PV_CHAIN;
		memset(wc, 0, sizeof(wc[0]) * m);
		int r = ibv_poll_cq(cq, m, wc);
		if (r < 0)
			return total > 0 ? total : r;
		for (int i = 0; i < r; i++) {
			pv_wc *o = &out[total + i];
			o->wr_id = wc[i].wr_id;
			o->status = wc[i].status;
			o->opcode = wc[i].opcode;
			o->byte_len = wc[i].byte_len;
			o->qp_num = wc[i].qp_num;
			o->vendor_err = wc[i].vendor_err;
		}
		total += r;
		if (r < m)
			break;
	}
	return total;
}
