//go:build linux && cgo && !noverbs && pegad_fakeverbs

// A loopback stand-in for libibverbs, used only by this package's tests so
// that the Go/C glue (object lifetimes, chain building, completion
// conversion, the context-op dispatch of ibv_post_send, ibv_poll_cq and
// ibv_query_port) runs on hosts without RDMA. It is not an RDMA
// implementation: work requests execute at post time by memcpy between MRs
// of one process, with an RC QP's checks (rkey/lkey, bounds, access, queue
// depth, states, flush after an error, RETRY_EXC_ERR toward a destroyed
// peer). One mutex serializes it. It is built only with -tags
// pegad_fakeverbs (the Makefile's test targets): a production binary has
// none of it (cmd/pegad's TestProductionBuildHasNoFakeHCA).
//
// Completions can be made visible a set delay after posting
// (pv_fake_set_delay), as a wire and a remote HCA would; a thread of the
// fake then adds them to their CQ at that moment and signals the CQ's
// completion channel (a pipe) when the CQ was armed. It is as strict as
// rdma-core's man pages: an armed CQ signals only for a CQE added after
// the arm (ibv_req_notify_cq(3)), once per arm ("one shot"), and a CQ with
// events got but not acked, or a channel with CQs, refuses to be destroyed
// (ibv_get_cq_event(3), ibv_create_comp_channel(3); libibverbs would hang
// or fail).

#define _GNU_SOURCE // pipe2
#include "fakeverbs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define FK_MAX 4096

typedef struct fk_mr {
	struct ibv_mr mr;
	int access;
} fk_mr;

// One CQE and the moment it becomes visible (CLOCK_MONOTONIC ns).
typedef struct fk_cqe {
	struct ibv_wc wc;
	uint64_t at;
	int added; // made visible: counted for the CQ's arm
} fk_cqe;

typedef struct fk_cq {
	struct ibv_cq cq;
	int cap, head, count;
	fk_cqe *ring;
	int armed, overrun;
	unsigned got, acked; // events taken by ibv_get_cq_event, acked
	int vector;          // comp_vector it was created on
} fk_cq;

// fk_comp_vectors is num_comp_vectors of every fake context.
#define fk_comp_vectors 4

// A completion channel: its events queue in memory, as the kernel's do
// (unbounded, never blocking the HCA), and its fd, a pipe's read end,
// holds one byte exactly while the queue is not empty (the fd is readable
// iff an event is queued, as the kernel's event file is).
typedef struct fk_chan {
	struct ibv_comp_channel ch; // ch.fd: the pipe's read end
	int wfd;
	struct fk_cq **q; // queued events, oldest first
	int qlen, qcap;
	int byte;         // the readiness byte is in the pipe
} fk_chan;

typedef struct fk_qp {
	struct ibv_qp qp;
	int state;
	uint32_t dest, max_send_wr, outstanding;
	uint8_t max_rd, max_dest_rd; // initiator depth (RTS), responder resources (RTR)
	// WRs posted while a port on their path is down: an HCA retries them
	// (rxe's retry_cnt 7 forever) until the port is back, or the QP is
	// moved to ERROR, which flushes them (IBV_WC_WR_FLUSH_ERR).
	struct ibv_send_wr *held;
	struct ibv_sge *held_sge;
	uint32_t nheld;
} fk_qp;

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static fk_mr *fk_mrs[FK_MAX];
static fk_qp *fk_qps[FK_MAX];
static void fk_release_held(fk_qp *q);
static void fk_run_binds(uint64_t now, uint32_t qpn, int drop); // fakemw.h
static int fk_mw_in_pd(struct ibv_pd *pd);
static uint64_t fk_now(void);
// pv_fake_port_state's type for a port down whose WRs fail at once (rxe).
#define FK_PORT_ERR_FAST 0x10000
static fk_cq *fk_cqs[FK_MAX];
static uint64_t fk_delay_ns;     // completion visibility delay
static int fk_timer_started;     // the visibility thread runs
static pthread_cond_t fk_timer_cv; // wakes it: a delayed CQE was queued
// fk_late_sum, fk_late_n: how late, past its moment, the timer thread
// signalled the channel of delayed CQEs (pv_fake_signal_lateness).
static uint64_t fk_late_sum, fk_late_n;
static uint32_t fk_next_key = 0x100, fk_next_qpn = 0x40;
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

// The fake's devices: eight RoCE ports, one per rail (GID ::ffff:10.0.N.5
// on pegadfakeN); an older HCA on rail 0 (fewer responder resources, a
// 4 GiB max_mr_size) as in a mixed fleet; and an InfiniBand port that
// requires a GRH (IBV_QPF_GRH_REQUIRED, as SR-IOV virtual functions in
// cloud VMs report), with a LID from a subnet manager.
typedef struct fk_desc {
	const char *name;
	uint8_t link_layer, flags;
	uint16_t lid;
	enum ibv_mtu active_mtu;
	int max_rd;           // max_qp_rd_atom and max_qp_init_rd_atom
	uint64_t max_mr_size;
	uint8_t rail;         // third byte of the RoCE v2 GID's IPv4 address
} fk_desc;

#define FK_NDEV 10
#define FK_ETH IBV_LINK_LAYER_ETHERNET
static const fk_desc fk_descs[FK_NDEV] = {
	{"pegadfake0", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 0},
	{"pegadfake1", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 1},
	{"pegadfake2", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 2},
	{"pegadfake3", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 3},
	{"pegadfake4", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 4},
	{"pegadfake5", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 5},
	{"pegadfake6", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 6},
	{"pegadfake7", FK_ETH, 0, 0, IBV_MTU_1024, 16, UINT64_MAX, 7},
	{"pegadfakeold0", FK_ETH, 0, 0, IBV_MTU_1024, 8, 1ULL << 32, 0},
	{"pegadfakeib0", IBV_LINK_LAYER_INFINIBAND, IBV_QPF_GRH_REQUIRED, 0x11, IBV_MTU_4096, 16, UINT64_MAX, 0},
};
static struct ibv_device fk_devs[FK_NDEV];
static int fk_port_down[FK_NDEV]; // pv_fake_port_event: the port went down
static int fk_gid_gen[FK_NDEV];   // pv_fake_port_event: the RoCE v2 GID changed this often

static const fk_desc *fk_desc_of(struct ibv_context *ctx) {
	return &fk_descs[ctx->device - fk_devs];
}

static struct ibv_device **fk_get_device_list(int *num) {
	struct ibv_device **l = calloc(FK_NDEV + 1, sizeof(*l));
	if (l == NULL)
		return NULL;
	for (int i = 0; i < FK_NDEV; i++) {
		strcpy(fk_devs[i].name, fk_descs[i].name);
		l[i] = &fk_devs[i];
	}
	if (num)
		*num = FK_NDEV;
	return l;
}

static void fk_free_device_list(struct ibv_device **l) { free(l); }

static const char *fk_get_device_name(struct ibv_device *d) { return d->name; }

#define FK_GID_TBL_LEN 4

// RoCE ports have the default P_Key only; the InfiniBand one a partition
// besides.
static int fk_pkey_tbl_len(const fk_desc *d) { return d->link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 2; }

static int fk_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len) {
	const fk_desc *d = fk_desc_of(ctx);
	if (port != 1)
		return EINVAL;
	memset(a, 0, len);
	pthread_mutex_lock(&fk_mu);
	a->state = fk_port_down[d - fk_descs] ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	pthread_mutex_unlock(&fk_mu);
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = d->active_mtu;
	a->gid_tbl_len = FK_GID_TBL_LEN;
	a->pkey_tbl_len = fk_pkey_tbl_len(d);
	a->link_layer = d->link_layer;
	a->lid = d->lid;
	a->flags = d->flags;
	return 0;
}

// RoCE: GID 0 link-local RoCE v1, GID 1 IPv4-mapped 10.0.0.5 RoCE v2.
// InfiniBand: GID 0, the default subnet prefix and the port GUID. Others
// empty.
static int fk_gid(const fk_desc *d, int idx, uint8_t *raw, uint32_t *type) {
	memset(raw, 0, 16);
	if (d->link_layer == IBV_LINK_LAYER_INFINIBAND) {
		if (idx != 0)
			return ENODATA;
		raw[0] = 0xfe, raw[1] = 0x80, raw[8] = 0x02, raw[15] = 0x11;
		*type = IBV_GID_TYPE_IB;
		return 0;
	}
	switch (idx) {
	case 0:
		raw[0] = 0xfe, raw[1] = 0x80, raw[15] = 1;
		*type = IBV_GID_TYPE_ROCE_V1;
		return 0;
	case 1:
		raw[10] = 0xff, raw[11] = 0xff, raw[12] = 10, raw[14] = d->rail;
		pthread_mutex_lock(&fk_mu);
		// A GID change (an address removed and another added) moves the
		// port to the next /24 as well, so its subnet follows too.
		raw[13] = (uint8_t)fk_gid_gen[d - fk_descs];
		raw[15] = (uint8_t)(5 + fk_gid_gen[d - fk_descs]);
		pthread_mutex_unlock(&fk_mu);
		*type = IBV_GID_TYPE_ROCE_V2;
		return 0;
	}
	return ENODATA;
}

static int fk_query_gid(struct ibv_context *ctx, uint8_t port, int idx, union ibv_gid *g) {
	uint32_t t;
	(void)port;
	return fk_gid(fk_desc_of(ctx), idx, g->raw, &t) ? -1 : 0;
}

static int fk_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t idx,
			   struct ibv_gid_entry *e, uint32_t flags, size_t size) {
	(void)flags, (void)size;
	e->gid_index = idx;
	e->port_num = port;
	return fk_gid(fk_desc_of(ctx), (int)idx, e->gid.raw, &e->gid_type);
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static struct ibv_mw *fk_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type); // fakemw.h
static int fk_dealloc_mw(struct ibv_mw *mw);
static int fk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int fk_req_notify_cq(struct ibv_cq *cq, int solicited_only);

// An open context and the write end of its async_fd pipe, where
// pv_fake_port_event puts events.
typedef struct fk_ctx {
	struct ibv_context *ctx;
	int async_wfd;
} fk_ctx;
static fk_ctx fk_ctxs[FK_MAX];

static struct ibv_context *fk_open_device(struct ibv_device *d) {
	struct verbs_context *v = calloc(1, sizeof(*v));
	if (v == NULL)
		return NULL;
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		free(v);
		return NULL;
	}
	pthread_mutex_lock(&fk_mu);
	int slot = -1;
	for (int i = 0; i < FK_MAX && slot < 0; i++)
		if (fk_ctxs[i].ctx == NULL)
			slot = i;
	if (slot >= 0)
		fk_ctxs[slot] = (fk_ctx){&v->context, p[1]};
	pthread_mutex_unlock(&fk_mu);
	if (slot < 0) {
		close(p[0]), close(p[1]), free(v);
		errno = ENOMEM;
		return NULL;
	}
	v->context.async_fd = p[0];
	v->context.num_comp_vectors = fk_comp_vectors;
	v->sz = sizeof(*v);
	v->query_port = fk_query_port;
	v->context.device = d;
	v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	v->context.ops.post_send = fk_post_send;
	v->context.ops.poll_cq = fk_poll_cq;
	v->context.ops.req_notify_cq = fk_req_notify_cq;
	v->context.ops.alloc_mw = fk_alloc_mw;
	v->context.ops.dealloc_mw = fk_dealloc_mw;
	return &v->context;
}

static int fk_close_device(struct ibv_context *ctx) {
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < FK_MAX; i++)
		if (fk_ctxs[i].ctx == ctx) {
			close(fk_ctxs[i].async_wfd);
			fk_ctxs[i].ctx = NULL;
		}
	pthread_mutex_unlock(&fk_mu);
	close(ctx->async_fd);
	free(verbs_get_ctx(ctx));
	return 0;
}

// An async event as the fake queues it on a context's async_fd.
typedef struct fk_aev {
	uint32_t type, port;
} fk_aev;

// Reads async_fd like libibverbs: read(2), so a non-blocking fd with
// nothing queued fails with EAGAIN.
static int fk_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev) {
	fk_aev a;
	if (read(ctx->async_fd, &a, sizeof(a)) != sizeof(a))
		return -1;
	memset(ev, 0, sizeof(*ev));
	ev->event_type = (enum ibv_event_type)a.type;
	ev->element.port_num = (int)a.port;
	return 0;
}

static void fk_ack_async_event(struct ibv_async_event *ev) { (void)ev; }

int pv_fake_cq_vector(struct ibv_cq *cq) {
	pthread_mutex_lock(&fk_mu);
	int v = ((fk_cq *)cq)->vector;
	pthread_mutex_unlock(&fk_mu);
	return v;
}

unsigned int pv_fake_cq_acked(struct ibv_cq *cq) {
	pthread_mutex_lock(&fk_mu);
	unsigned int n = ((fk_cq *)cq)->acked;
	pthread_mutex_unlock(&fk_mu);
	return n;
}

int pv_fake_chan_pending(struct ibv_cq *cq) {
	pthread_mutex_lock(&fk_mu);
	fk_chan *ch = (fk_chan *)cq->channel;
	int n = ch ? ch->qlen : 0;
	pthread_mutex_unlock(&fk_mu);
	return n;
}

void pv_fake_reset_ports(void) {
	pthread_mutex_lock(&fk_mu);
	memset(fk_port_down, 0, sizeof(fk_port_down));
	memset(fk_gid_gen, 0, sizeof(fk_gid_gen));
	pthread_mutex_unlock(&fk_mu);
}

// fk_set_port changes fake device i's port as event type says. Under fk_mu.
static void fk_set_port(int i, int type) {
	if (type == FK_PORT_ERR_FAST || type == IBV_EVENT_DEVICE_FATAL) {
		fk_port_down[i] = 2;
	} else if (type == IBV_EVENT_PORT_ERR) {
		fk_port_down[i] = 1;
	} else if (type == IBV_EVENT_PORT_ACTIVE) {
		fk_port_down[i] = 0;
		for (int k = 0; k < FK_MAX; k++)
			if (fk_qps[k] && fk_qps[k]->nheld > 0)
				fk_release_held(fk_qps[k]); // the HCA's retries get through
	} else if (type == IBV_EVENT_GID_CHANGE) {
		fk_gid_gen[i]++;
	}
}

void pv_fake_port_state(const char *dev, int type) {
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < FK_NDEV; i++)
		if (strcmp(fk_descs[i].name, dev) == 0)
			fk_set_port(i, type);
	pthread_mutex_unlock(&fk_mu);
}

int pv_fake_port_event(const char *dev, int type) {
	int told = 0;
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < FK_NDEV; i++) {
		if (strcmp(fk_descs[i].name, dev) != 0)
			continue;
		fk_set_port(i, type);
		for (int j = 0; j < FK_MAX; j++) {
			if (fk_ctxs[j].ctx == NULL || fk_ctxs[j].ctx->device != &fk_devs[i])
				continue;
			fk_aev a = {(uint32_t)type, 1};
			if (write(fk_ctxs[j].async_wfd, &a, sizeof(a)) == sizeof(a))
				told++;
		}
	}
	pthread_mutex_unlock(&fk_mu);
	return told;
}

static int fk_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	const fk_desc *d = fk_desc_of(ctx);
	memset(a, 0, sizeof(*a));
	a->max_qp_wr = 16384;
	a->max_sge = 30;
	a->max_cqe = 1 << 16;
	a->max_qp_rd_atom = d->max_rd;
	a->max_qp_init_rd_atom = d->max_rd;
	a->max_mr_size = d->max_mr_size;
	a->phys_port_cnt = 1;
	// The "old" device has no memory windows (the holder's fallback).
	if (strcmp(d->name, "pegadfakeold0") != 0) {
		a->max_mw = FK_MAX;
		a->device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	}
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
		if ((fk_mrs[i] && fk_mrs[i]->mr.pd == pd) || (fk_qps[i] && fk_qps[i]->qp.pd == pd) || fk_mw_in_pd(pd)) {
			pthread_mutex_unlock(&fk_mu);
			return EBUSY;
		}
	pthread_mutex_unlock(&fk_mu);
	free(pd);
	return 0;
}

// Access flags the fake knows: the three pegad uses and the optional
// relaxed ordering (IBV_ACCESS_OPTIONAL_RANGE).
#define FK_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND)

static struct ibv_mr *fk_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				      unsigned int access) {
	// ibv_reg_mr(3): REMOTE_WRITE needs LOCAL_WRITE, else EINVAL; and
	// the device's max_mr_size bounds a region (ibv_query_device(3)).
	if (len == 0 || iova != (uint64_t)(uintptr_t)addr ||
	    (access & ~(FK_ACCESS | IBV_ACCESS_OPTIONAL_RANGE)) != 0 ||
	    ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
	    len > fk_desc_of(pd->context)->max_mr_size) {
		errno = EINVAL;
		return NULL;
	}
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
	m->access = (int)access;
	int rc = fk_put((void **)fk_mrs, m);
	pthread_mutex_unlock(&fk_mu);
	if (rc) {
		free(m);
		errno = rc;
		return NULL;
	}
	return &m->mr;
}

// The exported ibv_reg_mr takes the same path in libibverbs (verbs.c).
static struct ibv_mr *fk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return fk_reg_mr_iova2(pd, addr, len, (uint64_t)(uintptr_t)addr, (unsigned int)access);
}

int pv_fake_mr_access(uint32_t lkey) {
	int a = -1;
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < fk_hi; i++)
		if (fk_mrs[i] && fk_mrs[i]->mr.lkey == lkey)
			a = fk_mrs[i]->access;
	pthread_mutex_unlock(&fk_mu);
	return a;
}

static int fk_mr_has_mw(fk_mr *m);

static int fk_dereg_mr(struct ibv_mr *mr) {
	pthread_mutex_lock(&fk_mu);
	if (fk_mr_has_mw((fk_mr *)mr)) {
		pthread_mutex_unlock(&fk_mu);
		return EBUSY; // ibv_dereg_mr(3): windows still bound over it
	}
	fk_del((void **)fk_mrs, mr);
	pthread_mutex_unlock(&fk_mu);
	free(mr);
	return 0;
}

static uint64_t fk_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct ibv_comp_channel *fk_create_comp_channel(struct ibv_context *ctx) {
	int p[2];
	fk_chan *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	if (pipe2(p, O_CLOEXEC) != 0) {
		free(c);
		return NULL;
	}
	c->ch.context = ctx;
	c->ch.fd = p[0];
	c->wfd = p[1];
	return &c->ch;
}

// ibv_create_comp_channel(3): "fails if any CQs are still associated".
static int fk_destroy_comp_channel(struct ibv_comp_channel *ch) {
	fk_chan *c = (fk_chan *)ch;
	pthread_mutex_lock(&fk_mu);
	int busy = ch->refcnt > 0;
	pthread_mutex_unlock(&fk_mu);
	if (busy)
		return EBUSY;
	close(ch->fd);
	close(c->wfd);
	free(c->q);
	free(c);
	return 0;
}

// fk_chan_unready takes the readiness byte out once the queue is empty.
// fk_mu held.
static void fk_chan_unready(fk_chan *ch) {
	uint8_t b;
	if (ch->qlen == 0 && ch->byte && read(ch->ch.fd, &b, 1) == 1)
		ch->byte = 0;
}

// fk_signal puts one event for c on its channel, as the kernel queues a
// struct ib_uverbs_comp_event_desc naming the CQ. fk_mu held.
static void fk_signal(fk_cq *c) {
	fk_chan *ch = (fk_chan *)c->cq.channel;
	c->armed = 0;
	if (ch == NULL)
		return;
	if (ch->qlen == ch->qcap) {
		int n = ch->qcap ? 2 * ch->qcap : 16;
		fk_cq **q = realloc(ch->q, (size_t)n * sizeof(*q));
		if (q == NULL)
			abort(); // losing an event would hang a waiter
		ch->q = q, ch->qcap = n;
	}
	ch->q[ch->qlen++] = c;
	uint8_t b = 1;
	if (!ch->byte && write(ch->wfd, &b, 1) == 1)
		ch->byte = 1;
}

// fk_add makes c's CQEs whose moment has come visible; the first of them
// fires an armed CQ's event. fk_mu held.
static void fk_add(fk_cq *c, uint64_t now) {
	for (int i = 0; i < c->count; i++) {
		fk_cqe *e = &c->ring[(c->head + i) % c->cap];
		if (e->added)
			continue;
		if (e->at > now)
			break; // CQEs become visible in order
		e->added = 1;
		if (c->armed) {
			if (fk_delay_ns > 0) {
				fk_late_sum += now - e->at;
				fk_late_n++;
			}
			fk_signal(c);
		}
	}
}

// fk_timer_spin_ns: fk_timer sleeps until this long before a CQE's moment
// and spins the rest (pv_fake_set_timer_spin; fk_mu). A timed wait on an
// idle 2-vCPU VM wakes 20-40us late (more at longer sleeps), which the READ
// latency benchmark had counted as the daemon's (issue 36 item 6).
static uint64_t fk_timer_spin_ns = 50000;

// fk_timer adds delayed CQEs at their moment (the thread lives as long as
// the process: tests only).
static void *fk_timer(void *arg) {
	(void)arg;
	prctl(PR_SET_TIMERSLACK, 1UL); // the default 50us slack would blur the delay
	pthread_mutex_lock(&fk_mu);
	for (;;) {
		uint64_t now = fk_now(), next = UINT64_MAX;
		for (int i = 0; i < fk_hi; i++) {
			fk_cq *c = fk_cqs[i];
			if (c == NULL)
				continue;
			fk_add(c, now);
			for (int j = 0; j < c->count; j++) {
				fk_cqe *e = &c->ring[(c->head + j) % c->cap];
				if (!e->added) {
					if (e->at < next)
						next = e->at;
					break;
				}
			}
		}
		if (next == UINT64_MAX) {
			pthread_cond_wait(&fk_timer_cv, &fk_mu);
			continue;
		}
		if (next - now > fk_timer_spin_ns) {
			uint64_t at = next - fk_timer_spin_ns;
			struct timespec ts = {.tv_sec = (time_t)(at / 1000000000u), .tv_nsec = (long)(at % 1000000000u)};
			pthread_cond_timedwait(&fk_timer_cv, &fk_mu, &ts);
			continue;
		}
		// The last stretch is spun, unlocked (posts and polls go on), so
		// the CQE's moment is the one set and not the VM's idle wake-up.
		pthread_mutex_unlock(&fk_mu);
		while (fk_now() < next)
			sched_yield();
		pthread_mutex_lock(&fk_mu);
	}
	return NULL;
}

static struct ibv_cq *fk_create_cq(struct ibv_context *ctx, int cqe, void *cq_ctx,
				   struct ibv_comp_channel *ch, int vector) {
	if (vector < 0 || vector >= ctx->num_comp_vectors) {
		errno = EINVAL; // as the kernel answers an out-of-range vector
		return NULL;
	}
	fk_cq *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->vector = vector;
	c->ring = calloc((size_t)cqe, sizeof(*c->ring));
	if (c->ring == NULL) {
		free(c);
		return NULL;
	}
	c->cap = cqe;
	c->cq.context = ctx;
	c->cq.cqe = cqe;
	c->cq.channel = ch;
	c->cq.cq_context = cq_ctx;
	pthread_mutex_lock(&fk_mu);
	int rc = fk_put((void **)fk_cqs, c);
	if (rc == 0 && ch != NULL)
		ch->refcnt++;
	pthread_mutex_unlock(&fk_mu);
	if (rc) {
		free(c->ring);
		free(c);
		errno = rc;
		return NULL;
	}
	return &c->cq;
}

static int fk_destroy_cq(struct ibv_cq *cq) {
	fk_cq *c = (fk_cq *)cq;
	pthread_mutex_lock(&fk_mu);
	for (int i = 0; i < fk_hi; i++)
		if (fk_qps[i] && fk_qps[i]->qp.send_cq == cq) {
			pthread_mutex_unlock(&fk_mu);
			return EBUSY;
		}
	// ibv_get_cq_event(3): "destroying a CQ will wait for all completion
	// events to be acknowledged"; here that hang is an error.
	if (c->got != c->acked) {
		pthread_mutex_unlock(&fk_mu);
		return EBUSY;
	}
	fk_del((void **)fk_cqs, c);
	if (cq->channel) {
		// The kernel drops a destroyed CQ's unread events.
		fk_chan *ch = (fk_chan *)cq->channel;
		int kept = 0;
		for (int i = 0; i < ch->qlen; i++)
			if (ch->q[i] != c)
				ch->q[kept++] = ch->q[i];
		ch->qlen = kept;
		fk_chan_unready(ch);
		cq->channel->refcnt--;
	}
	pthread_mutex_unlock(&fk_mu);
	free(c->ring);
	free(c);
	return 0;
}

// ibv_req_notify_cq(3): one event for the next CQE added, not for those
// already in the CQ.
static int fk_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
	fk_cq *c = (fk_cq *)cq;
	if (solicited_only)
		return EINVAL; // pegad never asks; the fake does not model it
	pthread_mutex_lock(&fk_mu);
	fk_add(c, fk_now()); // CQEs whose moment passed were added before the arm
	c->armed = 1;
	pthread_mutex_unlock(&fk_mu);
	return 0;
}

// Takes the oldest event like libibverbs: with nothing queued, a
// non-blocking fd fails with EAGAIN and a blocking one waits.
static int fk_get_cq_event(struct ibv_comp_channel *ibch, struct ibv_cq **cq, void **cq_ctx) {
	fk_chan *ch = (fk_chan *)ibch;
	for (;;) {
		pthread_mutex_lock(&fk_mu);
		if (ch->qlen > 0) {
			fk_cq *c = ch->q[0];
			memmove(ch->q, ch->q + 1, (size_t)(ch->qlen - 1) * sizeof(*ch->q));
			ch->qlen--;
			fk_chan_unready(ch);
			c->got++;
			pthread_mutex_unlock(&fk_mu);
			*cq = &c->cq;
			*cq_ctx = c->cq.cq_context;
			return 0;
		}
		pthread_mutex_unlock(&fk_mu);
		int fl = fcntl(ibch->fd, F_GETFL);
		if (fl < 0)
			return -1;
		if (fl & O_NONBLOCK) {
			errno = EAGAIN;
			return -1;
		}
		struct pollfd pfd = {.fd = ibch->fd, .events = POLLIN};
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			return -1;
	}
}

static void fk_ack_cq_events(struct ibv_cq *cq, unsigned int n) {
	pthread_mutex_lock(&fk_mu);
	((fk_cq *)cq)->acked += n;
	pthread_mutex_unlock(&fk_mu);
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
		fk_release_held(q); // ibv_modify_qp(3): ERROR flushes outstanding WRs
		fk_run_binds(0, qp->qp_num, 0);
	} else if (a->qp_state == IBV_QPS_INIT) {
		int need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		// A P_Key index past the port's table is EINVAL (the kernel's
		// ib_modify_qp_is_ok / mlx5 check it against pkey_tbl_len).
		if (q->state != IBV_QPS_RESET || (mask & need) != need || a->port_num != 1 ||
		    a->pkey_index >= fk_pkey_tbl_len(fk_desc_of(qp->context)))
			rc = EINVAL;
		else
			q->state = IBV_QPS_INIT;
	} else if (a->qp_state == IBV_QPS_RTR) {
		const fk_desc *d = fk_desc_of(qp->context);
		int need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		int eth = d->link_layer == IBV_LINK_LAYER_ETHERNET;
		struct ibv_ah_attr *ah = &a->ah_attr;
		if (q->state != IBV_QPS_INIT || (mask & need) != need || a->path_mtu < IBV_MTU_256 ||
		    a->path_mtu > d->active_mtu || ah->port_num != 1 || a->max_dest_rd_atomic > d->max_rd)
			rc = EINVAL;
		// RoCE addresses by GID only; ibv_modify_qp(3): "If port flag
		// IBV_QPF_GRH_REQUIRED is set then ah_attr ... must be passed with
		// ... .is_global = 1" (mlx5 and the kernel: EINVAL).
		else if ((eth || (d->flags & IBV_QPF_GRH_REQUIRED)) && !ah->is_global)
			rc = EINVAL;
		else if (ah->is_global && (ah->grh.sgid_index >= FK_GID_TBL_LEN || ah->grh.hop_limit == 0))
			rc = EINVAL;
		else if (!eth && (ah->dlid == 0 || ah->dlid >= 0xc000)) // IB routes by a unicast LID
			rc = EINVAL;
		else {
			q->dest = a->dest_qp_num;
			q->max_dest_rd = a->max_dest_rd_atomic;
			q->state = IBV_QPS_RTR;
		}
	} else if (a->qp_state == IBV_QPS_RTS) {
		int need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			   IBV_QP_MAX_QP_RD_ATOMIC;
		if (q->state != IBV_QPS_RTR || (mask & need) != need ||
		    a->max_rd_atomic > fk_desc_of(qp->context)->max_rd || a->max_rd_atomic == 0)
			rc = EINVAL;
		else {
			q->max_rd = a->max_rd_atomic;
			q->state = IBV_QPS_RTS;
		}
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
	fk_run_binds(0, q->qp.qp_num, 1); // its delayed binds go with it
	fk_del((void **)fk_qps, q);
	// Like mlx5, drop the destroyed QP's entries from its CQ.
	fk_cq *c = (fk_cq *)q->qp.send_cq;
	int kept = 0;
	for (int i = 0; i < c->count; i++) {
		fk_cqe e = c->ring[(c->head + i) % c->cap];
		if (e.wc.qp_num != q->qp.qp_num)
			c->ring[(c->head + kept++) % c->cap] = e;
	}
	c->count = kept;
	pthread_mutex_unlock(&fk_mu);
	free(q->held);
	free(q->held_sge);
	free(q);
	return 0;
}

#include "fakemw.h"

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
	if (c->count == c->cap) {
		// ibv_poll_cq(3): after an overrun "the CQ cannot be used".
		c->overrun = 1;
		return;
	}
	fk_cqe *e = &c->ring[(c->head + c->count++) % c->cap];
	memset(e, 0, sizeof(*e));
	e->at = fk_now() + fk_delay_ns;
	struct ibv_wc *w = &e->wc;
	w->wr_id = wr->wr_id;
	w->status = st;
	w->qp_num = q->qp.qp_num;
	w->opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
		    : wr->opcode == IBV_WR_BIND_MW ? IBV_WC_BIND_MW
		    : wr->opcode == IBV_WR_LOCAL_INV ? IBV_WC_LOCAL_INV : IBV_WC_RDMA_WRITE;
	w->byte_len = st == IBV_WC_SUCCESS && wr->num_sge > 0 ? wr->sg_list[0].length : 0;
	if (st != IBV_WC_SUCCESS) {
		w->opcode = 0xff; // undefined for failed completions
		w->vendor_err = 0x99;
	}
	if (fk_delay_ns == 0) {
		fk_add(c, e->at);
		return;
	}
	if (!fk_timer_started) {
		pthread_t t;
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&fk_timer_cv, &ca);
		pthread_condattr_destroy(&ca);
		if (pthread_create(&t, NULL, fk_timer, NULL) != 0)
			abort();
		pthread_detach(t);
		fk_timer_started = 1;
	}
	pthread_cond_signal(&fk_timer_cv);
}

// fk_held: fk_execute's answer for a WR whose path has a port down; it
// completes later (fk_release_held).
#define FK_HELD ((enum ibv_wc_status)-1)

static enum ibv_wc_status fk_execute(fk_qp *q, struct ibv_send_wr *wr) {
	if (q->state == IBV_QPS_ERR)
		return IBV_WC_WR_FLUSH_ERR;
	fk_qp *r = fk_find_qp(q->dest);
	if (r == NULL || r->dest != q->qp.qp_num || (r->state != IBV_QPS_RTR && r->state != IBV_QPS_RTS))
		return IBV_WC_RETRY_EXC_ERR;
	const fk_desc *ld = fk_desc_of(q->qp.context), *rd = fk_desc_of(r->qp.context);
	// A local port down as rxe has it (2: its netdev down) fails the WR
	// at once; otherwise the HCA retries it until the port is back.
	if (fk_port_down[ld - fk_descs] == 2)
		return IBV_WC_LOC_QP_OP_ERR;
	if (fk_port_down[ld - fk_descs] || fk_port_down[rd - fk_descs])
		return FK_HELD;
	// Rail-isolated fabric: each RoCE rail is its own network, so RTR
	// toward another rail succeeds and then nothing arrives.
	if (ld->link_layer != rd->link_layer || ld->rail != rd->rail)
		return IBV_WC_RETRY_EXC_ERR;
	int read = wr->opcode == IBV_WR_RDMA_READ;
	// An initiator depth above the responder's resources: hardware NAKs
	// (Invalid Request) once more READs are in flight than the responder
	// holds; the fake fails every READ of such a QP, so one READ shows it.
	if (read && q->max_rd > r->max_dest_rd)
		return IBV_WC_REM_INV_REQ_ERR;
	struct ibv_sge *s = &wr->sg_list[0];
	if (wr->num_sge != 1 || fk_find_mr(q->qp.pd, s->lkey, 0, s->addr, s->length,
					     read ? IBV_ACCESS_LOCAL_WRITE : 0) == NULL)
		return IBV_WC_LOC_PROT_ERR;
	int racc = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	if ((wr->wr.rdma.rkey & FK_MW_KEY) ? !fk_mw_allows(r, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, s->length, racc)
					    : fk_find_mr(r->qp.pd, wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr,
							 s->length, racc) == NULL)
		return IBV_WC_REM_ACCESS_ERR;
	void *l = (void *)(uintptr_t)s->addr, *rm = (void *)(uintptr_t)wr->wr.rdma.remote_addr;
	if (read)
		memmove(l, rm, s->length);
	else
		memmove(rm, l, s->length);
	return IBV_WC_SUCCESS;
}

// fk_hold keeps a copy of wr (one SGE, as fk_execute requires) until its
// path is up again or q is moved to ERROR. Under fk_mu; outstanding
// bounds the count by max_send_wr.
static void fk_hold(fk_qp *q, struct ibv_send_wr *wr) {
	if (q->held == NULL) {
		q->held = calloc(q->max_send_wr, sizeof(*q->held));
		q->held_sge = calloc(q->max_send_wr, sizeof(*q->held_sge));
		if (q->held == NULL || q->held_sge == NULL)
			abort();
	}
	uint32_t i = q->nheld++;
	q->held[i] = *wr;
	q->held_sge[i] = wr->sg_list[0];
	q->held[i].sg_list = &q->held_sge[i];
	q->held[i].next = NULL;
}

// fk_release_held completes q's held WRs: flushed when q is in ERROR,
// else executed again (held anew while a port is still down). Under fk_mu.
static void fk_release_held(fk_qp *q) {
	uint32_t n = q->nheld;
	q->nheld = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct ibv_send_wr *wr = &q->held[i];
		enum ibv_wc_status st = fk_execute(q, wr);
		if (st == FK_HELD) {
			q->held[q->nheld] = *wr;
			q->held_sge[q->nheld] = q->held_sge[i];
			q->held[q->nheld].sg_list = &q->held_sge[q->nheld];
			q->nheld++;
			continue;
		}
		if (st != IBV_WC_SUCCESS)
			q->state = IBV_QPS_ERR;
		fk_complete(q, wr, st);
	}
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	fk_qp *q = (fk_qp *)qp;
	pthread_mutex_lock(&fk_mu);
	fk_run_binds(fk_now(), 0, 0);
	for (; wr != NULL; wr = wr->next) {
		int rc = 0;
		if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR)
			rc = EINVAL;
		else if (q->outstanding >= q->max_send_wr)
			rc = ENOMEM;
		else if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE &&
			 wr->opcode != IBV_WR_BIND_MW && wr->opcode != IBV_WR_LOCAL_INV)
			rc = EINVAL;
		if (rc) {
			*bad = wr;
			pthread_mutex_unlock(&fk_mu);
			return rc;
		}
		q->outstanding++;
		int mst = fk_mw_execute(q, wr);
		if (mst == FK_DEFERRED)
			continue;
		enum ibv_wc_status st = mst >= 0 ? (enum ibv_wc_status)mst : fk_execute(q, wr);
		if (st == FK_HELD) {
			fk_hold(q, wr);
			continue;
		}
		if (st != IBV_WC_SUCCESS)
			q->state = IBV_QPS_ERR;
		fk_complete(q, wr, st);
	}
	pthread_mutex_unlock(&fk_mu);
	return 0;
}

// mlx5's poll returns CQ_POLL_ERR (-2) for a CQ it cannot read; the fake
// does so after an overrun.
#define FK_POLL_ERR (-2)

static int fk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	fk_cq *c = (fk_cq *)cq;
	int k = 0;
	pthread_mutex_lock(&fk_mu);
	if (c->overrun) {
		pthread_mutex_unlock(&fk_mu);
		return FK_POLL_ERR;
	}
	fk_run_binds(fk_now(), 0, 0);
	fk_add(c, fk_now());
	for (; k < n && c->count > 0 && c->ring[c->head].added; k++) {
		wc[k] = c->ring[c->head].wc;
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
		fk_lib.reg_mr_iova2 = fk_reg_mr_iova2;
		fk_lib.dereg_mr = fk_dereg_mr;
		fk_lib.create_cq = fk_create_cq;
		fk_lib.destroy_cq = fk_destroy_cq;
		fk_lib.create_comp_channel = fk_create_comp_channel;
		fk_lib.destroy_comp_channel = fk_destroy_comp_channel;
		fk_lib.get_cq_event = fk_get_cq_event;
		fk_lib.ack_cq_events = fk_ack_cq_events;
		fk_lib.get_async_event = fk_get_async_event;
		fk_lib.ack_async_event = fk_ack_async_event;
		fk_lib.create_qp = fk_create_qp;
		fk_lib.modify_qp = fk_modify_qp;
		fk_lib.query_qp = fk_query_qp;
		fk_lib.destroy_qp = fk_destroy_qp;
	}
	pthread_mutex_unlock(&fk_mu);
	return &fk_lib;
}

void pv_fake_set_delay(uint64_t ns) {
	pthread_mutex_lock(&fk_mu);
	fk_delay_ns = ns;
	pthread_mutex_unlock(&fk_mu);
}

void pv_fake_set_timer_spin(uint64_t ns) {
	pthread_mutex_lock(&fk_mu);
	fk_timer_spin_ns = ns;
	pthread_mutex_unlock(&fk_mu);
}

uint64_t pv_fake_signal_lateness(void) {
	pthread_mutex_lock(&fk_mu);
	uint64_t mean = fk_late_n ? fk_late_sum / fk_late_n : 0;
	fk_late_sum = fk_late_n = 0;
	pthread_mutex_unlock(&fk_mu);
	return mean;
}
