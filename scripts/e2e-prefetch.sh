#!/usr/bin/env bash
# e2e-prefetch.sh: issue 4's scripted check with two real pegads over the
# tcp transport, loopback only. Holder A gets random blocks (1 KiB to
# 64 MiB, K/V split and contiguous) through pegactl; requester B fetches
# them with `pegactl --socket B prefetch --peer A ...`; then
#   - every block read back from B is byte-identical to what was put on A;
#   - a second prefetch answers already_local and fetches nothing;
#   - a hash A lacks is missing_on_peer (exit 3);
#   - A holds no session and no locked block afterwards, and its
#     query_blocks_for_transfer OK count equals its release_transfer_lock OK count;
#   - B's `conns list` shows A connected with qps = nics x qps-per-peer, and
#     B's pegaflow_rdma_qps says the same;
#   - both daemons stop with exit 0 on SIGTERM.
# Bounded: the whole script fails after E2E_TIMEOUT seconds (default 240).
source "$(dirname "$0")/lib.sh"
bound_script "${E2E_TIMEOUT:-240}"

NICS=${E2E_NICS:-2}
QPS_PER_PEER=${E2E_QPS_PER_PEER:-2}
build

common=(--transport tcp --tcp-data-listen 127.0.0.1:0 --nics "$NICS" --qps-per-peer "$QPS_PER_PEER"
	--pool-size 192MiB --lock-timeout 10s --gc-interval 200ms --log-format json --log-level info)
SOCK_A=$WORK/a.sock
SOCK_B=$WORK/b.sock
PEER_A=127.0.0.1:$(free_port)
PEER_B=127.0.0.1:$(free_port)
MPORT_A=$(free_port)
MPORT_B=$(free_port)
METRICS_A=http://127.0.0.1:$MPORT_A/metrics
METRICS_B=http://127.0.0.1:$MPORT_B/metrics
start_pegad a --node-id e2e-a --socket "$SOCK_A" --listen "$PEER_A" --metrics-listen "127.0.0.1:$MPORT_A" "${common[@]}"
start_pegad b --node-id e2e-b --socket "$SOCK_B" --listen "$PEER_B" --metrics-listen "127.0.0.1:$MPORT_B" "${common[@]}"
wait_ready "$PID_a" "$SOCK_A"
wait_ready "$PID_b" "$SOCK_B"
ctl_a() { "$PEGACTL" --socket "$SOCK_A" --timeout 60s "$@"; }
ctl_b() { "$PEGACTL" --socket "$SOCK_B" --timeout 60s "$@"; }
NS=e2e

# name: "mode size..." (k: each file one K segment; kv: pairs K,V per slot)
D=$WORK/data
mkdir -p "$D"
declare -A HASH SPEC=(
	[kib]="k 1024"
	[kv]="kv 65536 65536 65536 65536"
	[mixed]="k 3000 1 777777"
	[big]="kv 8388608 8388608"
	[huge]="k 67108864"
)
NAMES=(kib kv mixed big huge)
for name in "${NAMES[@]}"; do
	read -r mode sizes <<<"${SPEC[$name]}"
	# shellcheck disable=SC2086 # sizes is a list
	block_files "$D" "$name" "$mode" $sizes
	HASH[$name]=$(random_hash)
	ctl_a blocks put --namespace "$NS" --hash "${HASH[$name]}" "${BLOCK_ARGS[@]}" >/dev/null
done
pass "put ${#NAMES[@]} blocks on A"
ALL=()
for name in "${NAMES[@]}"; do ALL+=("${HASH[$name]}"); done

# --- fetch and compare -------------------------------------------------------
ctl_b -o json prefetch --peer "$PEER_A" --namespace "$NS" "${ALL[@]}" >"$D/prefetch.json"
check "prefetch on B: every block fetched" \
	"len(d['blocks']) == ${#ALL[@]} and all(b['status'] == 'fetched' for b in d['blocks']) and d['bytes'] > 0" <"$D/prefetch.json"
log "prefetch: $(jq_py '"%d bytes in %.3f s" % (d["bytes"], d["duration_seconds"])' <"$D/prefetch.json")"
for name in "${NAMES[@]}"; do
	ctl_b blocks get --namespace "$NS" --hash "${HASH[$name]}" --out "$D/$name.got" >/dev/null
	cmp "$D/$name.got" "$D/$name.expect" || fail "block $name fetched by B differs from what was put on A"
done
pass "all ${#NAMES[@]} blocks read back from B byte-identical"
ctl_b -o json blocks list --namespace "$NS" | check "B's copies keep the slot layout" \
	"[b['slots'] for b in d['blocks'] if b['hash'] == '${HASH[big]}'] == [[{'k_size': 8388608, 'v_size': 8388608}]]"

ctl_b -o json prefetch --peer "$PEER_A" --namespace "$NS" "${ALL[@]}" | check "second prefetch: already_local" \
	"all(b['status'] == 'already_local' for b in d['blocks'])"
# Every query that locked something was released exactly once. Taken
# before the missing-hash prefetch below: a query that finds nothing locks
# nothing and needs no release.
holder_rpc_ok() { metric "$METRICS_A" "pegaflow_holder_rpc_total{code=\"OK\",rpc=\"$1\"}"; }
queries_released() {
	Q=$(holder_rpc_ok query_blocks_for_transfer)
	R=$(holder_rpc_ok release_transfer_lock)
	[[ $Q -ge 1 && $Q == "$R" ]]
}
wait_until 10 "A's release_transfer_lock OK count to equal its query_blocks_for_transfer OK count" queries_released
pass "A: query_blocks_for_transfer OK ($Q) == release_transfer_lock OK ($R)"

rc=0
MISSING=$(random_hash)
ctl_b -o json prefetch --peer "$PEER_A" --namespace "$NS" "$MISSING" >"$D/missing.json" 2>"$D/err" || rc=$?
[[ $rc -eq 3 ]] || fail "prefetch of a hash A lacks: exit $rc ($(cat "$D/err")), want 3"
check "prefetch of a hash A lacks: missing_on_peer, exit 3" "d['blocks'][0]['status'] == 'missing_on_peer'" <"$D/missing.json"

# --- no lock left on the holder ----------------------------------------------
wait_until 10 "A to hold no session" no_sessions "$SOCK_A"
pass "A's sessions list is empty"
ctl_a -o json stats | check "A: no active session, no locked block, no lock timeout" \
	"d['sessions_active'] == 0 and d['locked_blocks'] == 0 and d['lock_timeouts'] == 0"
ctl_b -o json sessions list | check "B: no fetch in flight" "d['fetches'] == []"

# --- connections and QP count -------------------------------------------------
WANT_QPS=$((NICS * QPS_PER_PEER))
ctl_b -o json conns list | check "B's conns list: A connected with $WANT_QPS QPs over $NICS NICs" \
	"[(c['state'], c['qps'], len(c['nics'])) for c in d['conns'] if c['peer'] == '$PEER_A'] == [('connected', $WANT_QPS, $NICS)]"
ctl_b conns list >&2
QPS_METRIC=$(metric "$METRICS_B" pegaflow_rdma_qps)
[[ $QPS_METRIC == "$WANT_QPS" ]] || fail "B: pegaflow_rdma_qps = $QPS_METRIC, want peers x nics x qps-per-peer = $WANT_QPS"
pass "B: pegaflow_rdma_qps = $QPS_METRIC"
ctl_b -o json stats | check "B: fetch counters" "d['fetches_ok'] >= 1 and d['fetches_failed'] == 0"

# --- graceful stop -----------------------------------------------------------
stop_pegad "$PID_b"
stop_pegad "$PID_a"
pass "SIGTERM: both pegads exited 0"
log "e2e-prefetch: PASS"
