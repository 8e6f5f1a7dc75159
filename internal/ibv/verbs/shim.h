// C side of the verbs provider: a table of libibverbs entry points resolved
// with dlsym, and helpers that build work requests and QP attributes in C
// memory. Go passes only plain integers and structs without pointers.
#ifndef PEGAD_VERBS_SHIM_H
#define PEGAD_VERBS_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

// pv_lib holds one dlopen'ed libibverbs. It is never freed: providers
// loaded by libibverbs may keep threads and state for the process's life.
typedef struct pv_lib {
	void *handle;
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	// The exported ibv_query_port takes the old, shorter struct; verbs.h
	// wraps it in a static inline that prefers the context op.
	int (*query_port_compat)(struct ibv_context *ctx, uint8_t port, void *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int idx, union ibv_gid *gid);
	// Optional (IBVERBS_1.11): GID with its type; NULL on older libraries.
	int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t idx,
			    struct ibv_gid_entry *entry, uint32_t flags, size_t size);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	// Optional (IBVERBS_1.8): what verbs.h's ibv_reg_mr macro calls when
	// optional access flags (IBV_ACCESS_RELAXED_ORDERING) are set.
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
				    struct ibv_comp_channel *ch, int vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			struct ibv_qp_init_attr *init);
	int (*destroy_qp)(struct ibv_qp *qp);
} pv_lib;

// pv_open loads name and resolves the entry points. Returns 0, or 1 when
// dlopen fails, 2 when a required symbol is missing; err gets dlerror's
// text or the symbol's name.
int pv_open(const char *name, pv_lib **out, char *err, size_t errlen);

// Calls that return a pointer report errno through *err.
struct ibv_device **pv_get_device_list(pv_lib *l, int *num, int *err);
struct ibv_context *pv_open_device(pv_lib *l, struct ibv_device *dev, int *err);
void pv_free_device_list(pv_lib *l, struct ibv_device **list);
const char *pv_get_device_name(pv_lib *l, struct ibv_device *dev);
int pv_close_device(pv_lib *l, struct ibv_context *ctx);
int pv_dealloc_pd(pv_lib *l, struct ibv_pd *pd);
int pv_dereg_mr(pv_lib *l, struct ibv_mr *mr);
int pv_destroy_cq(pv_lib *l, struct ibv_cq *cq);
int pv_destroy_qp(pv_lib *l, struct ibv_qp *qp);

// Flat copies of the attributes pegad uses.
typedef struct pv_devattr {
	int max_qp_wr, max_sge, max_cq, max_cqe, max_qp, max_mr;
	int max_qp_rd_atom, max_qp_init_rd_atom;
	uint64_t max_mr_size;
	uint8_t phys_port_cnt;
} pv_devattr;

typedef struct pv_portattr {
	int state, max_mtu, active_mtu, gid_tbl_len;
	uint16_t lid;
	uint8_t link_layer;
	uint8_t flags; // IBV_QPF_GRH_REQUIRED
	uint16_t pkey_tbl_len;
} pv_portattr;

// Calls that return a status return 0 or a positive errno.
int pv_query_device(pv_lib *l, struct ibv_context *ctx, pv_devattr *out);
int pv_query_port(pv_lib *l, struct ibv_context *ctx, uint8_t port, pv_portattr *out);
// *type is enum ibv_gid_type, or -1 when the library cannot say.
int pv_query_gid(pv_lib *l, struct ibv_context *ctx, uint8_t port, int idx,
		 uint8_t gid[16], int *type);

struct ibv_pd *pv_alloc_pd(pv_lib *l, struct ibv_context *ctx, int *err);
// Registers with access; optional flags (IBV_ACCESS_RELAXED_ORDERING) go
// through ibv_reg_mr_iova2 as verbs.h's ibv_reg_mr does, and are dropped
// on a library too old to have it (as libibverbs drops them where the
// kernel lacks support).
struct ibv_mr *pv_reg_mr(pv_lib *l, struct ibv_pd *pd, uintptr_t addr, size_t len,
			 int access, int *err);
// Creates a completion channel (its fd made O_NONBLOCK, as
// ibv_get_cq_event(3) shows for non-blocking use) and a CQ on it. *gofd is
// a close-on-exec dup of the channel's fd for Go's netpoller (Go closes it;
// ibv_destroy_comp_channel closes the original).
// pv_create_cq creates a CQ on comp_vector vector (< ctx's
// num_comp_vectors) with its own completion channel.
struct ibv_cq *pv_create_cq(pv_lib *l, struct ibv_context *ctx, int depth,
			    int vector, struct ibv_comp_channel **ch, int *gofd, int *err);
int pv_destroy_comp_channel(pv_lib *l, struct ibv_comp_channel *ch);
// Arms cq for one completion event (ibv_req_notify_cq(3), solicited_only 0).
int pv_req_notify_cq(struct ibv_cq *cq);
// Takes one event off ch and acknowledges it at once (so ibv_destroy_cq
// never waits for acks): 0, EAGAIN when none is queued, or an errno.
// pv_get_cq_event takes one event of ch without acking it: the caller
// acks with pv_ack_cq_events (ibv_ack_cq_events takes a mutex: acking in
// batches is what ibv_get_cq_event(3) advises).
int pv_get_cq_event(pv_lib *l, struct ibv_comp_channel *ch);
void pv_ack_cq_events(pv_lib *l, struct ibv_cq *cq, unsigned int n);
// Creates an RC QP on cq (send and receive) with no inline data and
// unsignaled-by-default sends (each WR says).
struct ibv_qp *pv_create_qp(pv_lib *l, struct ibv_pd *pd, struct ibv_cq *cq,
			    uint32_t max_send_wr, uint32_t max_recv_wr,
			    uint32_t max_send_sge, int *err);
// RESET->INIT on port with pkey_index and LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE.
int pv_qp_init(pv_lib *l, struct ibv_qp *qp, uint8_t port, uint16_t pkey_index);

// What RTR and RTS need, as plain values (see buildConnParams in Go).
typedef struct pv_conn {
	uint32_t path_mtu, dest_qpn, rq_psn, sq_psn;
	uint8_t max_dest_rd_atomic, min_rnr_timer, timeout, retry_cnt, rnr_retry, max_rd_atomic;
	uint8_t port, is_global, sgid_index, hop_limit, traffic_class, sl;
	uint16_t dlid;
	uint8_t dgid[16];
} pv_conn;

void pv_fill_rtr(const pv_conn *p, struct ibv_qp_attr *a, int *mask);
void pv_fill_rts(const pv_conn *p, struct ibv_qp_attr *a, int *mask);
// Reads back what pv_fill_rtr/pv_fill_rts wrote (tests).
void pv_conn_readback(const pv_conn *in, pv_conn *rtr, int *rtr_mask, pv_conn *rts, int *rts_mask);
int pv_qp_rtr(pv_lib *l, struct ibv_qp *qp, const pv_conn *p);
int pv_qp_rts(pv_lib *l, struct ibv_qp *qp, const pv_conn *p);
int pv_qp_to_error(pv_lib *l, struct ibv_qp *qp);
int pv_qp_state(pv_lib *l, struct ibv_qp *qp, int *state);

// One send work request with one scatter/gather entry.
typedef struct pv_wr {
	uint64_t wr_id, laddr, raddr;
	uint32_t len, lkey, rkey, opcode, flags;
} pv_wr;

// Posts n work requests as chains of at most PV_CHAIN; on failure *bad is
// the index of the first request not posted (-1 if unknown) and the return
// value the errno. Requests before *bad are posted.
#define PV_CHAIN 64
int pv_post_send(struct ibv_qp *qp, const pv_wr *w, int n, int *bad);

typedef struct pv_wc {
	uint64_t wr_id;
	uint32_t status, opcode, byte_len, qp_num, vendor_err;
} pv_wc;

// Polls up to n completions into out; returns the count, or the
// provider's negative return when nothing was polled (ibv_poll_cq(3): "a
// negative value", not an errno; mlx5 returns -2, CQ_POLL_ERR).
int pv_poll_cq(struct ibv_cq *cq, int n, pv_wc *out);

// Makes ctx->async_fd non-blocking (ibv_get_async_event(3)) and returns a
// close-on-exec dup of it for Go's netpoller, or -errno.
int pv_async_fd(struct ibv_context *ctx);
// Takes one async event off ctx and acks it at once: 0 with *type (enum
// ibv_event_type) and *port (port events; 0 otherwise), EAGAIN when none is
// queued, or an errno.
int pv_get_async_event(pv_lib *l, struct ibv_context *ctx, int *type, int *port);

#endif
