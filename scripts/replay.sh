#!/usr/bin/env bash
# replay.sh: `make replay` (issue 25). Replays the Mooncake FAST'25
# synthetic trace (internal/replay/testdata) through a fresh pegad whose
# pool holds 2, 5, 10 and 20 % of the trace's 43,924 unique blocks, and
# prints pegad's prefix hit ratio beside LRU and Belady at the capacity
# each run saw, once per eviction policy (EVICTIONS: prefix, then lru;
# pegad's figure is the policy's). TRACE, BLOCK_SIZE (bytes), SHARES and
# EVICTIONS override.
source "$(dirname "$0")/lib.sh"
bound_script "${REPLAY_TIMEOUT:-900}"

TRACE=${TRACE:-$ROOT/internal/replay/testdata/mooncake_fast25_synthetic_trace.jsonl.gz}
BLOCK_SIZE=${BLOCK_SIZE:-16384}
SHARES=${SHARES:-"2 5 10 20"}
EVICTIONS=${EVICTIONS:-"prefix lru"}
build
UNIQUE=$(python3 - "$TRACE" <<'PY'
import gzip, json, sys
p = sys.argv[1]
f = gzip.open(p, "rt") if p.endswith(".gz") else open(p)
print(len({h for line in f if line.strip() for h in json.loads(line)["hash_ids"]}))
PY
)
log "trace $(basename "$TRACE"): $UNIQUE unique blocks of $BLOCK_SIZE bytes"
printf '%-6s %-7s %9s %9s %8s %8s %8s %9s %8s\n' SHARE POLICY BLOCKS CAPACITY PEGAD LRU BELADY OF_BELADY DROPPED
for share in $SHARES; do
for eviction in $EVICTIONS; do
	blocks=$((UNIQUE * share / 100))
	pool=$((blocks * BLOCK_SIZE))
	(( pool >= 1048576 )) || pool=1048576
	name=r${share}_$eviction
	sock=$WORK/$name.sock
	start_pegad "$name" --node-id "replay-$share" --transport tcp --socket "$sock" \
		--listen 127.0.0.1:0 --metrics-listen "" --tcp-data-listen 127.0.0.1:0 \
		--pool-size "$pool" --eviction "$eviction" --log-format json --log-level warn
	pid_var=PID_$name
	wait_ready "${!pid_var}" "$sock"
	out=$("$PEGACTL" --socket "$sock" -o json bench replay --trace "$TRACE" --block-size "$BLOCK_SIZE")
	python3 - "$share" "$blocks" "$out" <<'PY'
import json, sys
share, blocks, r = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
of = r["hit_ratio"] / r["belady"] if r["belady"] else 0
print(f'{share + "%":<6} {r["policy"]:<7} {blocks:9d} {r["capacity_blocks"]:9d} {r["hit_ratio"]:8.3f} {r["lru"]:8.3f} {r["belady"]:8.3f} {of:9.2f} {r["dropped"]:8d}')
PY
	kill -TERM "${!pid_var}"
	wait "${!pid_var}" 2>/dev/null || true
done
done
