#!/usr/bin/env bash
# e2e-foundation.sh: issue 2's scripted check on one real pegad (tcp
# transport, loopback only, temp socket). It
#   1. puts random blocks through pegactl (multi-MiB, K/V split, several
#      slots, one byte) and reads each back byte-identical (file and stdout);
#   2. locks two blocks through the holder RPC (scripts/lockclient), sees the
#      session in `pegactl sessions list -o json`, releases it with
#      `pegactl locks release`;
#   3. locks again, deletes a locked block (its memory must stay), lets the
#      session expire after --lock-timeout 3s: pegaflow_transfer_lock_timeouts_total
#      goes 0 -> 1, "Transfer lock expired" is logged, the memory comes back;
#   4. deletes every block: pool used returns to the baseline;
#   5. SIGTERM: pegad exits 0, and pegactl then reports it unavailable (exit 4).
# Bounded: the whole script fails after E2E_TIMEOUT seconds (default 240).
source "$(dirname "$0")/lib.sh"
bound_script "${E2E_TIMEOUT:-240}"

build
SOCK=$WORK/pegad.sock
PEER_PORT=$(free_port)
METRICS_PORT=$(free_port)
PEER=127.0.0.1:$PEER_PORT
METRICS=http://127.0.0.1:$METRICS_PORT/metrics
NS=e2e

start_pegad a --node-id e2e-a --transport tcp --socket "$SOCK" --listen "$PEER" \
	--metrics-listen "127.0.0.1:$METRICS_PORT" --tcp-data-listen 127.0.0.1:0 \
	--pool-size 64MiB --lock-timeout 3s --gc-interval 200ms --log-format json --log-level info
wait_ready "$PID_a" "$SOCK"
ctl() { "$PEGACTL" --socket "$SOCK" --timeout 20s "$@"; }

BASE_USED=$(ctl stats -o json | jq_py 'd["pool_used"]')
log "pool used at start: $BASE_USED bytes"
[[ $(metric "$METRICS" pegaflow_transfer_lock_timeouts_total) == 0 ]] || fail "lock timeouts not 0 at start"

# --- 1. put and get byte-identical -----------------------------------------
D=$WORK/data
mkdir -p "$D"
declare -A HASH EXPECT
# name: "mode size..." (k: each file one K segment; kv: pairs K,V per slot)
declare -A SPEC=(
	[big]="k 5243003"             # 5 MiB + 123: multi-chunk single segment
	[kvsplit]="kv 1048576 1048576 777 3000" # two slots, K and V each
	[slots]="k 4096 4096 4096"    # three K-only slots
	[huge]="k 12582912"           # 12 MiB
	[tiny]="k 1"
)
for name in big kvsplit slots huge tiny; do
	read -r mode sizes <<<"${SPEC[$name]}"
	# shellcheck disable=SC2086 # sizes is a list
	block_files "$D" "$name" "$mode" $sizes
	HASH[$name]=$(random_hash)
	EXPECT[$name]=$D/$name.expect
	ctl -o json blocks put --namespace "$NS" --hash "${HASH[$name]}" "${BLOCK_ARGS[@]}" |
		check "put $name ($sizes)" "d['created'] and d['bytes'] == $(stat -c %s "$D/$name.expect")"
done
for name in big kvsplit slots huge tiny; do
	ctl blocks get --namespace "$NS" --hash "${HASH[$name]}" --out "$D/$name.got" >/dev/null
	cmp "$D/$name.got" "${EXPECT[$name]}" || fail "get $name: bytes differ from what was put"
	pass "get $name byte-identical"
done
ctl blocks get --namespace "$NS" --hash "${HASH[kvsplit]}" --out - | cmp - "${EXPECT[kvsplit]}" ||
	fail "get --out - differs"
pass "get --out - byte-identical"
ctl -o json blocks list --namespace "$NS" | check "list shows the 5 blocks" \
	"sorted(b['hash'] for b in d['blocks']) == sorted('${HASH[*]}'.split()) and not d['truncated']"
ctl -o json blocks list --namespace "$NS" | check "kvsplit has 2 K/V slots" \
	"[b['slots'] for b in d['blocks'] if b['hash'] == '${HASH[kvsplit]}'] == [[{'k_size': 1048576, 'v_size': 1048576}, {'k_size': 777, 'v_size': 3000}]]"
rc=0
ctl blocks get --namespace "$NS" --hash "$(random_hash)" --out "$D/none" 2>"$D/err" || rc=$?
[[ $rc -eq 3 && $(wc -l <"$D/err") -eq 1 ]] && grep -q '^Error: ' "$D/err" ||
	fail "get of an unknown block: exit $rc, stderr $(cat "$D/err"), want exit 3 and one Error line"
pass "get of an unknown block: exit 3, $(cat "$D/err")"
USED_FULL=$(ctl stats -o json | jq_py 'd["pool_used"]')
((USED_FULL > BASE_USED)) || fail "pool used $USED_FULL did not grow from $BASE_USED after puts"

# --- 2. lock, see, release --------------------------------------------------
SID=$("$LOCKCLIENT" query --peer "$PEER" --namespace "$NS" "${HASH[big]}" "${HASH[kvsplit]}")
log "locked big+kvsplit under session $SID"
ctl -o json sessions list | check "session listed with its requester and 2 blocks" \
	"[(s['requester_id'], s['blocks']) for s in d['sessions'] if s['session_id'] == '$SID'] == [('e2e-lockclient', 2)]"
ctl -o json sessions list | check "session expires within the 3s lock timeout" \
	"all(0 < s['expires_in_seconds'] <= 3 for s in d['sessions'])"
ctl -o json stats | check "stats: 1 session, 2 locked blocks" "d['sessions_active'] == 1 and d['locked_blocks'] == 2"
ctl -o json locks release "$SID" | check "pegactl locks release released 2 blocks" \
	"d['released_blocks'] == 2 and d['session_id'] == '$SID' and '@' in d['operator']"
ctl -o json sessions list | check "no session after release" "d['sessions'] == []"
rc=0
ctl locks release "$SID" 2>"$D/err" >/dev/null || rc=$?
[[ $rc -eq 3 ]] || fail "second pegactl locks release of $SID: exit $rc ($(cat "$D/err")), want 3"
pass "second pegactl locks release: exit 3, $(cat "$D/err")"
OUT=$("$LOCKCLIENT" release --peer "$PEER" "$SID")
[[ $OUT == *"released_blocks=0 was_live=false"* ]] || fail "second release of $SID: $OUT"
pass "holder release after force-release is idempotent: $OUT"
grep -q "$SID" "$WORK/a.log" || fail "force release of $SID not logged"

# --- 3. lock again and let it expire ----------------------------------------
SID2=$("$LOCKCLIENT" query --peer "$PEER" --namespace "$NS" "${HASH[huge]}" "${HASH[tiny]}")
log "locked huge+tiny under session $SID2; deleting huge while locked"
ctl -o json blocks delete --namespace "$NS" --hash "${HASH[huge]}" | check "delete of a locked block is deferred" "d['deferred']"
USED_LOCKED=$(ctl stats -o json | jq_py 'd["pool_used"]')
[[ $USED_LOCKED == "$USED_FULL" ]] || fail "pool used changed from $USED_FULL to $USED_LOCKED while the deleted block is pinned"
pass "a pinned, deleted block keeps its memory ($USED_LOCKED bytes used)"
wait_until 15 "session $SID2 to expire" no_sessions "$SOCK"
pass "session expired"
# It leaves the listing at its deadline; the sweeper then counts it.
wait_until 5 "the sweeper to count the expiry" metric_at_least "$METRICS" pegaflow_transfer_lock_timeouts_total 1
[[ $(metric "$METRICS" pegaflow_transfer_lock_timeouts_total) == 1 ]] ||
	fail "pegaflow_transfer_lock_timeouts_total = $(metric "$METRICS" pegaflow_transfer_lock_timeouts_total), want 1"
pass "pegaflow_transfer_lock_timeouts_total 0 -> 1"
grep 'Transfer lock expired' "$WORK/a.log" | grep -q "$SID2" || fail "no 'Transfer lock expired' log line for $SID2"
pass "expiry logged: $(grep 'Transfer lock expired' "$WORK/a.log" | head -1)"
ctl -o json stats | check "stats after expiry: no lock, 1 timeout, huge's memory back" \
	"d['sessions_active'] == 0 and d['locked_blocks'] == 0 and d['lock_timeouts'] == 1 and d['pool_used'] < $USED_LOCKED"
OUT=$("$LOCKCLIENT" release --peer "$PEER" "$SID2")
[[ $OUT == *"was_live=false"* ]] || fail "late release of expired $SID2: $OUT"
pass "late release of the expired session says was_live=false: $OUT"

# --- 4. memory back to the baseline -----------------------------------------
for name in big kvsplit slots tiny; do
	ctl blocks delete --namespace "$NS" --hash "${HASH[$name]}" >/dev/null
done
ctl -o json stats | check "pool used back to the baseline ($BASE_USED) and no blocks" \
	"d['pool_used'] == $BASE_USED and d['blocks'] == 0"

# --- 5. graceful stop --------------------------------------------------------
stop_pegad "$PID_a"
pass "SIGTERM: pegad exited 0"
rc=0
ctl stats 2>"$D/err" >/dev/null || rc=$?
[[ $rc -eq 4 ]] || fail "pegactl against a stopped pegad: exit $rc, want 4"
pass "pegactl against a stopped pegad: exit 4, $(cat "$D/err")"
log "e2e-foundation: PASS"
