#!/usr/bin/env bash
# replay.sh: `make replay` (issues 25 and 35). Replays each trace of
# internal/replay/testdata (the Mooncake FAST'25 synthetic trace and the
# arXiv slice) through a fresh pegad whose pool holds 2, 5, 10 and 20 %
# of the trace's unique blocks (rounded to the nearest block), once per
# eviction policy (EVICTIONS: adaptive, prefix, lru), and prints pegad's
# prefix hit ratio beside the fixed rivals simulated in the same run
# (LRU, W-TinyLFU, S3-FIFO: internal/replay/rivals.go) and Belady:
# VS_BEST is pegad ÷ the best rival (issue 35's target: ≥ 0.97), GAP is
# the share of the gap from the best rival to Belady that pegad closed
# (negative: below the best rival), LRU_GAP the share of the gap from
# LRU to Belady. Then the held-out check: the
# synthetic trace's halves, simulated in process. TRACES, BLOCK_SIZE
# (bytes), SHARES and EVICTIONS override.
source "$(dirname "$0")/lib.sh"
bound_script "${REPLAY_TIMEOUT:-900}"

TD=$ROOT/internal/replay/testdata
TRACES=${TRACES:-"$TD/mooncake_fast25_synthetic_trace.jsonl.gz $TD/mooncake_arxiv_trace_slice.jsonl.gz"}
BLOCK_SIZE=${BLOCK_SIZE:-16384}
SHARES=${SHARES:-"2 5 10 20"}
EVICTIONS=${EVICTIONS:-"adaptive prefix lru"}
build
RIVALS=$WORK/rivals
go build -o "$RIVALS" "$ROOT/internal/replay/rivals"

# row POLICY PEGAD RIVALS_JSON: one line of the table.
row() {
	python3 - "$@" <<'PY'
import json, sys
trace, share, policy, pegad, r = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), json.loads(sys.argv[5])
best = max(r["lru"], r["wtinylfu"], r["s3fifo"])
gap = (pegad - best) / (r["belady"] - best) if r["belady"] > best else 0
lgap = (pegad - r["lru"]) / (r["belady"] - r["lru"]) if r["belady"] > r["lru"] else 0
print(f'{trace:<9} {share + "%":<5} {r["capacity"]:6d} {policy:<9} {pegad:6.3f} {r["lru"]:6.3f} {r["wtinylfu"]:6.3f} {r["s3fifo"]:6.3f} {r["belady"]:6.3f} {pegad / best:7.3f} {gap:6.3f} {lgap:7.3f}')
PY
}

printf '%-9s %-5s %6s %-9s %6s %6s %6s %6s %6s %7s %6s %7s\n' TRACE SHARE BLOCKS POLICY PEGAD LRU WTLFU S3FIFO BELADY VS_BEST GAP LRU_GAP
for trace in $TRACES; do
	short=$(basename "$trace" | sed -e 's/mooncake_//' -e 's/_.*//')
	for share in $SHARES; do
		rivals=$("$RIVALS" -trace "$trace" -share "$share")
		blocks=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["capacity"])' "$rivals")
		pool=$((blocks * BLOCK_SIZE))
		(( pool >= 1048576 )) || pool=1048576
		for eviction in $EVICTIONS; do
			name=r${short}${share}_$eviction
			sock=$WORK/$name.sock
			start_pegad "$name" --node-id "replay-$share" --transport tcp --socket "$sock" \
				--listen 127.0.0.1:0 --metrics-listen "" --tcp-data-listen 127.0.0.1:0 \
				--pool-size "$pool" --eviction "$eviction" --log-format json --log-level warn
			pid_var=PID_$name
			wait_ready "${!pid_var}" "$sock"
			out=$("$PEGACTL" --socket "$sock" -o json bench replay --trace "$trace" --block-size "$BLOCK_SIZE")
			got=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["hit_ratio"], r["capacity_blocks"], r["dropped"])' "$out")
			read -r hit cap dropped <<<"$got"
			(( cap == blocks )) || log "note: $name held at most $cap blocks, not $blocks"
			(( dropped == 0 )) || log "note: $name dropped $dropped blocks"
			row "$short" "$share" "$eviction" "$hit" "$rivals"
			kill -TERM "${!pid_var}"
			wait "${!pid_var}" 2>/dev/null || true
		done
	done
done

echo
echo "held-out check: the synthetic trace's halves, simulated in process (POLICY adaptive)"
for half in first second; do
	for share in $SHARES; do
		rivals=$("$RIVALS" -trace "$TD/mooncake_fast25_synthetic_trace.jsonl.gz" -share "$share" -half "$half")
		hit=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["adaptive"])' "$rivals")
		row "synth-$half" "$share" adaptive "$hit" "$rivals"
	done
done
