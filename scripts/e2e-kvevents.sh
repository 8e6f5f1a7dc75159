#!/usr/bin/env bash
# e2e-kvevents.sh: issue 26's KV events on a real pegad (tcp transport,
# loopback). A subscriber that decodes as llm-d does
# (internal/kvevents/testdata/subscriber.py; Debian's python3-zmq and
# python3-msgpack) watches while pegactl
#   1. puts four 1 MiB blocks into a 4 MiB pool: four BlockStored;
#   2. puts a fifth: the oldest is evicted (BlockRemoved; --eviction lru,
#      which names the oldest: adaptive, the default, would keep it and
#      evict the newest of four blocks put once), then BlockStored
#      (pegactl's client may reserve room for a next put: more evictions);
#   3. deletes one: BlockRemoved;
# each with its hash, medium "cpu", sequence numbers 0, 1, 2, ... in the
# store's order, on topic kv@<node>@<namespace>, and the blocks a router
# following the events holds are exactly `pegactl blocks list`. A late subscriber gets them all
# again from the replay socket; /metrics counts them; SIGTERM exits 0.
# Bounded: the whole script fails after E2E_TIMEOUT seconds (default 180).
source "$(dirname "$0")/lib.sh"
bound_script "${E2E_TIMEOUT:-180}"

PY=${PYTHON:-/usr/bin/python3}
"$PY" -c 'import zmq, msgpack' 2>/dev/null ||
	fail "$PY lacks zmq or msgpack (apt-get install python3-zmq python3-msgpack)"
SUB=$ROOT/internal/kvevents/testdata/subscriber.py

build
SOCK=$WORK/pegad.sock
METRICS_PORT=$(free_port)
METRICS=http://127.0.0.1:$METRICS_PORT/metrics
EV_PORT=$(free_port)
REPLAY_PORT=$(free_port)
NS=e2e-model

start_pegad a --node-id kv-a --transport tcp --socket "$SOCK" --listen 127.0.0.1:0 \
	--metrics-listen "127.0.0.1:$METRICS_PORT" --tcp-data-listen 127.0.0.1:0 --pool-size 4MiB --eviction lru \
	--kv-events-endpoint "tcp://127.0.0.1:$EV_PORT" --kv-events-replay-endpoint "tcp://127.0.0.1:$REPLAY_PORT" \
	--log-format json
wait_ready "$PID_a" "$SOCK"
wait_until 10 "the 'KV events enabled' log line" grep -q '"KV events enabled"' "$WORK/a.log"
ctl() { "$PEGACTL" --socket "$SOCK" --timeout 20s "$@"; }

"$PY" "$SUB" sub "tcp://127.0.0.1:$EV_PORT" "kv@kv-a@" >"$WORK/events.jsonl" 2>"$WORK/sub.log" &
PIDS+=("$!")
LOGS+=("$WORK/sub.log")
wait_until 20 "the subscriber connected" metric_at_least "$METRICS" pegaflow_kv_events_subscribers 1
sleep 0.5 # its subscription follows the connection

random_file "$WORK/block" 1048576
declare -a H
for i in 0 1 2 3 4; do
	H[i]=$(random_hash)
	ctl blocks put --namespace "$NS" --hash "${H[i]}" --file "$WORK/block" >/dev/null
done
ctl blocks delete --namespace "$NS" --hash "${H[2]}" >/dev/null 2>&1 ||
	fail "pegactl blocks delete ${H[2]}"
pass "5 puts into a pool of 4 and a delete"

# events FILE: "Tag:hash" for each event of the messages in FILE, in order,
# after checking sequence numbers (0, 1, 2, ...), topic and medium.
events() {
	"$PY" - "$1" "$NS" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
msgs = [l for l in lines if "events" in l]
out = []
for i, m in enumerate(msgs):
    if m["seq"] != i:
        sys.exit("message %d has sequence %d" % (i, m["seq"]))
    if "topic" in m and m["topic"] != "kv@kv-a@" + sys.argv[2]:
        sys.exit("topic %r" % m["topic"])
    for e in m["events"]:
        if e["medium"] != "cpu":
            sys.exit("medium %r" % e["medium"])
        out += ["%s:%s" % (e["tag"], h) for h in e["raw"]]
print(" ".join(out))
PY
}
# held EVENTS: the hashes a router following EVENTS holds, sorted, after
# checking each hash's history alternates stored, removed, stored...
held() {
	"$PY" - "$1" <<'PY'
import sys
have = set()
for ev in sys.argv[1].split():
    tag, h = ev.split(":")
    if (tag == "BlockStored") == (h in have):
        sys.exit("%s of %s out of order" % (tag, h))
    (have.add if tag == "BlockStored" else have.discard)(h)
print(" ".join(sorted(have)))
PY
}
# listed: the hashes pegad holds, sorted.
listed() { ctl -o json blocks list --namespace "$NS" | jq_py '" ".join(sorted(b["hash"] for b in d["blocks"]))'; }
# The router's view must come to equal pegad's index: that covers every
# eviction, wherever pegad's puts (and the client's room reserved for its
# next put) made them.
router_matches() { [[ $(held "$(events "$WORK/events.jsonl")") == "$(listed)" ]]; }
wait_until 20 "the subscriber's view equals pegactl blocks list" router_matches
EV=$(events "$WORK/events.jsonl")
log "events: $EV"
FIRST="BlockStored:${H[0]} BlockStored:${H[1]} BlockStored:${H[2]} BlockStored:${H[3]} BlockRemoved:${H[0]}"
[[ $EV == "$FIRST "* ]] || fail "the first events are not the four puts then the oldest block's eviction"
[[ $EV == *"BlockStored:${H[4]}"* && $EV == *"BlockRemoved:${H[2]}" ]] ||
	fail "no BlockStored for the fifth put, or the delete's BlockRemoved is not last"
[[ $(listed) != *"${H[2]}"* ]] || fail "deleted block still listed"
pass "subscriber (decoding as llm-d): puts, the eviction, the delete in order, sequence 0.., medium cpu; its view equals blocks list"

"$PY" "$SUB" replay "tcp://127.0.0.1:$REPLAY_PORT" 0 >"$WORK/replay.jsonl" || fail "replay request"
[[ $(events "$WORK/replay.jsonl") == "$EV" ]] || fail "replay: $(events "$WORK/replay.jsonl")"
pass "replay from sequence 0: the same events"

N_REMOVED=$(grep -o BlockRemoved <<<"$EV" | wc -l)
[[ $(metric "$METRICS" 'pegaflow_kv_events_published_total{kind="stored"}') == 5 ]] || fail "published{stored} != 5"
[[ $(metric "$METRICS" 'pegaflow_kv_events_published_total{kind="evicted"}') == $((N_REMOVED - 1)) ]] || fail "published{evicted} != $((N_REMOVED - 1))"
[[ $(metric "$METRICS" 'pegaflow_kv_events_published_total{kind="deleted"}') == 1 ]] || fail "published{deleted} != 1"
[[ $(metric "$METRICS" 'pegaflow_kv_events_replays_total') == 1 ]] || fail "replays != 1"
[[ $(metric "$METRICS" 'pegaflow_kv_events_dropped_total{reason="subscriber_slow"}') == 0 ]] || fail "drops counted"
pass "metrics: published stored 5, evicted $((N_REMOVED - 1)), deleted 1; 1 replay; no drop"

stop_pegad "$PID_a"
pass "SIGTERM: exit 0"
