// The test controls of fakeverbs.c, the loopback stand-in for libibverbs.
// Test builds only: fakeverbs.c, and the Go files that include this, are
// built with -tags pegad_fakeverbs (fake_cgo.go), never in a production
// binary.
#ifndef PEGAD_FAKEVERBS_H
#define PEGAD_FAKEVERBS_H

#include "shim.h"

// pv_fake_lib is the loopback stand-in of fakeverbs.c.
pv_lib *pv_fake_lib(void);
// pv_fake_set_delay makes the fake's completions visible ns after posting
// (0: at once).
void pv_fake_set_delay(uint64_t ns);
// pv_fake_set_timer_spin sets how long before a delayed CQE's moment the
// fake's timer thread stops sleeping and spins (default 50us; 0: it only
// sleeps, as before issue 36, and wakes as late as the host makes it).
void pv_fake_set_timer_spin(uint64_t ns);
// pv_fake_signal_lateness is the mean of how late (ns) past their moment
// delayed CQEs signalled an armed CQ's channel since the last call (0:
// none did), and starts a new count.
uint64_t pv_fake_signal_lateness(void);
// pv_fake_port_event changes port 1 of fake device dev as event type says
// (IBV_EVENT_PORT_ERR: down; IBV_EVENT_PORT_ACTIVE: up; IBV_EVENT_GID_CHANGE:
// a new RoCE v2 GID) and raises the event on every open context of it.
// Returns the number of contexts told.
int pv_fake_port_event(const char *dev, int type);
// pv_fake_port_state changes the port as pv_fake_port_event does, raising
// no event (the moment before the HCA reports it).
void pv_fake_port_state(const char *dev, int type);
// pv_fake_chan_pending is how many events wait on cq's channel.
int pv_fake_chan_pending(struct ibv_cq *cq);
// pv_fake_cq_acked is how many of cq's events were acked.
unsigned int pv_fake_cq_acked(struct ibv_cq *cq);
// pv_fake_cq_vector is the comp_vector cq was created on.
int pv_fake_cq_vector(struct ibv_cq *cq);
// pv_fake_reset_ports undoes every pv_fake_port_event (no event raised).
void pv_fake_reset_ports(void);
// pv_fake_mr_access is the access flags the fake MR with lkey was
// registered with, or -1.
int pv_fake_mr_access(uint32_t lkey);
// pv_fake_mw_faults sets the fake's memory-window faults (fakemw.h):
// binds executed bind_delay_ns after posting (UINT64_MAX: only a flush
// ends them; 0: at post), binds completing with bind_status (0: as they
// execute), ibv_dealloc_mw failing with dealloc_errno (0: it works).
void pv_fake_mw_faults(uint64_t bind_delay_ns, int bind_status, int dealloc_errno);
// pv_fake_mws counts the fake's bound windows, and those a peer's READ
// can use (their QP is in RTR or RTS).
void pv_fake_mws(int *bound, int *usable);

#endif
