#!/usr/bin/env bash
# e2e-local-protocol.sh: issue 11's check that docs/local-protocol.md is
# enough to write a client in another language, now with the real Python
# client (clients/python, package pegad, written from the document; driven
# by scripts/localproto.py) against a real pegad (tcp transport, loopback,
# temp socket):
#   0. the Python client agrees the newest version of the data socket
#      (api/localwire.Version, 3);
#   1. puts a 3 MiB block through the data socket with version 2's RESERVE +
#      PUT, and another with ALLOC, an in-place write and COMMIT; pegactl
#      (the Go client) reads both back byte-identical;
#   2. pegactl puts a block; the Python client reads it in place, identical;
#   3. a Python client holding a read lease and a write allocation is killed
#      with SIGKILL: no pin and no allocation remain, nothing was indexed.
# Bounded: the whole script fails after E2E_TIMEOUT seconds (default 120).
source "$(dirname "$0")/lib.sh"
bound_script "${E2E_TIMEOUT:-120}"

build
SOCK=$WORK/pegad.sock
PY="${PYTHON:-python3} $ROOT/scripts/localproto.py"
start_pegad a --node-id e2e-lp --transport tcp --socket "$SOCK" --listen "127.0.0.1:$(free_port)" \
	--metrics-listen "" --tcp-data-listen 127.0.0.1:0 --pool-size 64MiB --log-format json --log-level info
wait_ready "$PID_a" "$SOCK"
[[ -S $SOCK.data ]] || fail "no data socket at $SOCK.data"
ctl() { "$PEGACTL" --socket "$SOCK" --timeout 20s "$@"; }
D=$WORK/data
mkdir -p "$D"

# --- 0. newest version ---------------------------------------------------
WANT=$(sed -n 's/^const Version = \([0-9]*\)$/\1/p' "$ROOT/api/localwire/wire.go")
[[ -n $WANT && $($PY "$SOCK" version) == "$WANT" ]] || fail "the python client did not agree version $WANT (api/localwire.Version) of the data socket"
pass "python client speaks version $WANT of the data socket"

# --- 1. Python put, Go get ------------------------------------------------
random_file "$D/py.bin" $((3 << 20))
H1=$(random_hash)
[[ $($PY "$SOCK" put lp "$H1" "$D/py.bin") == created ]] || fail "python put did not create the block"
ctl blocks get --namespace lp --hash "$H1" --out "$D/py.out" >/dev/null
cmp -s "$D/py.bin" "$D/py.out" || fail "pegactl read back different bytes than the python client wrote"
pass "python put (RESERVE + PUT), pegactl get: byte-identical"
[[ $($PY "$SOCK" put lp "$H1" "$D/py.bin") == exists ]] || fail "second python put did not say exists"
H3=$(random_hash)
[[ $($PY "$SOCK" write lp "$H3" "$D/py.bin") == created ]] || fail "python write in place did not create the block"
ctl blocks get --namespace lp --hash "$H3" --out "$D/py3.out" >/dev/null
cmp -s "$D/py.bin" "$D/py3.out" || fail "pegactl read back different bytes than the python client wrote in place"
pass "python write in place (ALLOC + COMMIT), pegactl get: byte-identical"

# --- 2. Go put, Python get ------------------------------------------------
random_file "$D/k" $((1 << 20))
random_file "$D/v" 4097
H2=$(random_hash)
ctl blocks put --namespace lp --hash "$H2" --kv --file "$D/k" --file "$D/v" >/dev/null
$PY "$SOCK" get lp "$H2" "$D/go.out"
cat "$D/k" "$D/v" | cmp -s - "$D/go.out" || fail "python read back different bytes than pegactl put"
pass "pegactl put (K/V), python get in place: byte-identical"

# --- 3. kill -9 of a python client holding leases ---------------------------
USED=$(ctl stats -o json | jq_py 'd["pool_used"]')
exec {HOLD}< <(exec $PY "$SOCK" hold lp "$H2")
HOLD_PID=$!
read -r -t 20 line <&"$HOLD" || fail "python holder said nothing"
[[ $line == ready ]] || fail "python holder said: $line"
ctl stats -o json | check "the holder's pin and allocation are visible" 'd["pinned_blocks"] == 1 and d["pool_used"] == '"$((USED + 8192))"
kill -KILL "$HOLD_PID"
exec {HOLD}<&-
released() { ctl stats -o json | jq_py 'd["pinned_blocks"] == 0 and d["pool_used"] == '"$USED" | grep -qx true; }
wait_until 10 "the killed client's pin and allocation to end" released
ctl blocks get --namespace lp --hash "68656c642d$H2" --out "$D/none" >/dev/null 2>&1 && fail "the killed client's allocation was indexed"
pass "kill -9 of a python client: no pin, no allocation, nothing indexed"

stop_pegad "$PID_a"
log "e2e-local-protocol: PASS"
