#!/usr/bin/env bash
# e2e-killrequester.sh: issue 14's "done when" on real binaries, tcp
# transport, loopback only. Holder A (--rdma-idle-timeout 2s) serves a
# prefetch to requester B; then B is killed -9 (no RdmaDisconnect reaches
# A). A must, within the idle time and a few seconds:
#   - free B's queue pairs (pegaflow_rdma_qps back to 0),
#   - count it (pegaflow_rdma_accepted_reaped_total{reason="idle"} = 1),
#   - list no connection, and bring go_goroutines back to its count before
#     B connected;
# and a new requester C still fetches from A, which stops with exit 0.
# Bounded: the whole script fails after E2E_TIMEOUT seconds (default 180).
source "$(dirname "$0")/lib.sh"
bound_script "${E2E_TIMEOUT:-180}"

build
common=(--transport tcp --tcp-data-listen 127.0.0.1:0 --nics 2 --qps-per-peer 2
	--pool-size 64MiB --lock-timeout 10s --gc-interval 200ms --log-format json --log-level info)
SOCK_A=$WORK/a.sock
PEER_A=127.0.0.1:$(free_port)
MPORT_A=$(free_port)
METRICS_A=http://127.0.0.1:$MPORT_A/metrics
start_pegad a --node-id e2e-a --socket "$SOCK_A" --listen "$PEER_A" --metrics-listen "127.0.0.1:$MPORT_A" \
	--rdma-idle-timeout 2s "${common[@]}"
wait_ready "$PID_a" "$SOCK_A"
ctl_a() { "$PEGACTL" --socket "$SOCK_A" --timeout 30s "$@"; }

NS=e2e
D=$WORK/data
mkdir -p "$D"
block_files "$D" blk k 8388608
HASH=$(random_hash)
ctl_a blocks put --namespace "$NS" --hash "$HASH" "${BLOCK_ARGS[@]}" >/dev/null
pass "put an 8 MiB block on A"
BASE_G=$(metric "$METRICS_A" go_goroutines)
log "A: $BASE_G goroutines before any requester"

requester() { # NAME: starts requester NAME and prefetches the block from A
	local name=$1 sock=$WORK/$1.sock
	start_pegad "$name" --node-id "e2e-$name" --socket "$sock" --listen "127.0.0.1:$(free_port)" \
		--metrics-listen "" "${common[@]}"
	local pid_var=PID_$name
	wait_ready "${!pid_var}" "$sock"
	"$PEGACTL" --socket "$sock" --timeout 30s -o json prefetch --peer "$PEER_A" --namespace "$NS" "$HASH" |
		check "prefetch on $name" "all(b['status'] == 'fetched' for b in d['blocks'])"
}
requester b
[[ $(metric "$METRICS_A" pegaflow_rdma_qps) == 4 ]] || fail "A has $(metric "$METRICS_A" pegaflow_rdma_qps) QPs, want 4 (2 NICs x 2)"

kill -KILL "$PID_b"
wait "$PID_b" 2>/dev/null || true
log "killed B with SIGKILL"
qps_zero() { [[ $(metric "$METRICS_A" pegaflow_rdma_qps) == 0 ]]; }
wait_until 15 "A frees the dead requester's QPs" qps_zero
[[ $(metric "$METRICS_A" 'pegaflow_rdma_accepted_reaped_total{reason="idle"}') == 1 ]] ||
	fail "A reaped{idle} = $(metric "$METRICS_A" 'pegaflow_rdma_accepted_reaped_total{reason="idle"}'), want 1"
pass "A reaped B's connection (idle) and freed its QPs"
ctl_a -o json conns list | check "A lists no connection" "len(d.get('conns') or []) == 0"
goroutines_back() { (($(metric "$METRICS_A" go_goroutines) <= BASE_G)); }
wait_until 15 "A's goroutines back to $BASE_G" goroutines_back
pass "A's goroutines back to baseline ($(metric "$METRICS_A" go_goroutines) <= $BASE_G)"

requester c
pass "a new requester fetches from A"
stop_pegad "$PID_c"
stop_pegad "$PID_a"
pass "A and C stopped with exit 0"
