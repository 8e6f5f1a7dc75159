// abiprobe prints the layout and constants of the libibverbs declarations
// the verbs provider relies on, one "name value" line each.
// TestCarriedHeadersMatchSystem compiles it against the carried headers
// (include/) and against the system's, and requires identical output.
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define SZ(t) printf("sizeof(%s) %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof(%s.%s) %zu\n", #t, #f, offsetof(t, f))
#define K(c) printf("%s %lld\n", #c, (long long)(c))

int main(void) {
	SZ(struct ibv_device_attr); OFF(struct ibv_device_attr, max_qp_wr);
	OFF(struct ibv_device_attr, max_sge); OFF(struct ibv_device_attr, max_cqe);
	OFF(struct ibv_device_attr, max_mr_size); OFF(struct ibv_device_attr, max_qp_rd_atom);
	OFF(struct ibv_device_attr, max_qp_init_rd_atom); OFF(struct ibv_device_attr, phys_port_cnt);
	SZ(struct ibv_port_attr); OFF(struct ibv_port_attr, state); OFF(struct ibv_port_attr, active_mtu);
	OFF(struct ibv_port_attr, gid_tbl_len); OFF(struct ibv_port_attr, lid);
	OFF(struct ibv_port_attr, link_layer); OFF(struct ibv_port_attr, flags);
	SZ(union ibv_gid); SZ(struct ibv_gid_entry); OFF(struct ibv_gid_entry, gid_index);
	OFF(struct ibv_gid_entry, port_num); OFF(struct ibv_gid_entry, gid_type);
	SZ(struct ibv_global_route); OFF(struct ibv_global_route, sgid_index);
	OFF(struct ibv_global_route, hop_limit); OFF(struct ibv_global_route, traffic_class);
	SZ(struct ibv_ah_attr); OFF(struct ibv_ah_attr, dlid); OFF(struct ibv_ah_attr, sl);
	OFF(struct ibv_ah_attr, is_global); OFF(struct ibv_ah_attr, port_num);
	SZ(struct ibv_qp_attr); OFF(struct ibv_qp_attr, qp_state); OFF(struct ibv_qp_attr, path_mtu);
	OFF(struct ibv_qp_attr, rq_psn); OFF(struct ibv_qp_attr, sq_psn); OFF(struct ibv_qp_attr, dest_qp_num);
	OFF(struct ibv_qp_attr, qp_access_flags); OFF(struct ibv_qp_attr, ah_attr);
	OFF(struct ibv_qp_attr, pkey_index); OFF(struct ibv_qp_attr, max_rd_atomic);
	OFF(struct ibv_qp_attr, max_dest_rd_atomic); OFF(struct ibv_qp_attr, min_rnr_timer);
	OFF(struct ibv_qp_attr, port_num); OFF(struct ibv_qp_attr, timeout);
	OFF(struct ibv_qp_attr, retry_cnt); OFF(struct ibv_qp_attr, rnr_retry);
	SZ(struct ibv_qp_init_attr); OFF(struct ibv_qp_init_attr, send_cq); OFF(struct ibv_qp_init_attr, recv_cq);
	OFF(struct ibv_qp_init_attr, cap); OFF(struct ibv_qp_init_attr, qp_type); OFF(struct ibv_qp_init_attr, sq_sig_all);
	SZ(struct ibv_sge); OFF(struct ibv_sge, addr); OFF(struct ibv_sge, length); OFF(struct ibv_sge, lkey);
	SZ(struct ibv_send_wr); OFF(struct ibv_send_wr, wr_id); OFF(struct ibv_send_wr, next);
	OFF(struct ibv_send_wr, sg_list); OFF(struct ibv_send_wr, num_sge); OFF(struct ibv_send_wr, opcode);
	OFF(struct ibv_send_wr, send_flags); OFF(struct ibv_send_wr, wr.rdma.remote_addr);
	OFF(struct ibv_send_wr, wr.rdma.rkey);
	SZ(struct ibv_wc); OFF(struct ibv_wc, wr_id); OFF(struct ibv_wc, status); OFF(struct ibv_wc, opcode);
	OFF(struct ibv_wc, vendor_err); OFF(struct ibv_wc, byte_len); OFF(struct ibv_wc, qp_num);
	SZ(struct ibv_context); OFF(struct ibv_context, device); OFF(struct ibv_context, ops);
	OFF(struct ibv_context, cmd_fd); OFF(struct ibv_context, async_fd); OFF(struct ibv_context, num_comp_vectors);
	OFF(struct ibv_context_ops, poll_cq); OFF(struct ibv_context_ops, req_notify_cq);
	OFF(struct ibv_context_ops, post_send); OFF(struct ibv_context_ops, post_recv);
	OFF(struct ibv_context_ops, _compat_query_port);
	SZ(struct ibv_pd); SZ(struct ibv_mr); OFF(struct ibv_mr, addr); OFF(struct ibv_mr, length);
	OFF(struct ibv_mr, lkey); OFF(struct ibv_mr, rkey);
	SZ(struct ibv_cq); OFF(struct ibv_cq, context); OFF(struct ibv_cq, channel); OFF(struct ibv_cq, cqe);
	SZ(struct ibv_comp_channel); OFF(struct ibv_comp_channel, fd);
	SZ(struct ibv_qp); OFF(struct ibv_qp, context); OFF(struct ibv_qp, qp_num); OFF(struct ibv_qp, state);
	SZ(struct ibv_async_event); OFF(struct ibv_async_event, event_type);
	K(IBV_ACCESS_LOCAL_WRITE); K(IBV_ACCESS_REMOTE_WRITE); K(IBV_ACCESS_REMOTE_READ);
	K(IBV_ACCESS_RELAXED_ORDERING);
	K(IBV_GID_TYPE_IB); K(IBV_GID_TYPE_ROCE_V1); K(IBV_GID_TYPE_ROCE_V2);
	K(IBV_LINK_LAYER_INFINIBAND); K(IBV_LINK_LAYER_ETHERNET);
	K(IBV_MTU_256); K(IBV_MTU_1024); K(IBV_MTU_4096); K(IBV_PORT_ACTIVE); K(IBV_PORT_DOWN);
	K(IBV_QPS_RESET); K(IBV_QPS_INIT); K(IBV_QPS_RTR); K(IBV_QPS_RTS); K(IBV_QPS_ERR); K(IBV_QPT_RC);
	K(IBV_QP_STATE); K(IBV_QP_ACCESS_FLAGS); K(IBV_QP_PKEY_INDEX); K(IBV_QP_PORT); K(IBV_QP_AV);
	K(IBV_QP_PATH_MTU); K(IBV_QP_TIMEOUT); K(IBV_QP_RETRY_CNT); K(IBV_QP_RNR_RETRY);
	K(IBV_QP_RQ_PSN); K(IBV_QP_MAX_QP_RD_ATOMIC); K(IBV_QP_MIN_RNR_TIMER); K(IBV_QP_SQ_PSN);
	K(IBV_QP_MAX_DEST_RD_ATOMIC); K(IBV_QP_DEST_QPN);
	K(IBV_SEND_SIGNALED); K(IBV_WR_RDMA_WRITE); K(IBV_WR_RDMA_READ);
	K(IBV_WC_SUCCESS); K(IBV_WC_LOC_PROT_ERR); K(IBV_WC_WR_FLUSH_ERR); K(IBV_WC_REM_ACCESS_ERR);
	K(IBV_WC_RETRY_EXC_ERR); K(IBV_WC_RDMA_WRITE); K(IBV_WC_RDMA_READ);
	K(IBV_EVENT_PORT_ACTIVE); K(IBV_EVENT_PORT_ERR); K(IBV_EVENT_GID_CHANGE); K(IBV_EVENT_DEVICE_FATAL);
	K(IBV_QPF_GRH_REQUIRED);
	return 0;
}
