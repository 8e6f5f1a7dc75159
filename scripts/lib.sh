# shellcheck shell=bash
# Shared helpers of the e2e scripts: build, free loopback ports, start and
# stop pegad daemons, bounded waits, JSON and /metrics checks. Sourced, not
# run. Everything lives under $WORK (removed at exit) and binds 127.0.0.1.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pegad-e2e.XXXXXX")
PIDS=()      # daemons started by start_pegad
LOGS=()      # their log files, printed on failure
WATCHDOG=""  # bounds the whole script

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
pass() { log "ok: $*"; }

# cleanup runs at every exit: kills what the script started, prints the
# daemons' logs when the script failed, removes $WORK.
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	[[ -n "$WATCHDOG" ]] && kill "$WATCHDOG" 2>/dev/null || true
	local pid
	for pid in "${PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ $rc -ne 0 ]]; then
		local f
		for f in "${LOGS[@]}"; do
			[[ -f "$f" ]] || continue
			echo "----- $f (last 200 lines) -----" >&2
			tail -n 200 "$f" >&2
		done
		log "FAILED (exit $rc)"
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "timed out (watchdog)"; exit 124' TERM

# bound_script SECONDS: the whole script fails after SECONDS.
# The watchdog kills its sleep when it is itself killed, and holds none of
# the script's output open, so a pipeline reading the script ends with it.
bound_script() {
	(
		trap 'kill "$sp" 2>/dev/null; exit 0' TERM
		sleep "$1" &
		sp=$!
		wait "$sp" && kill -TERM $$
	) >/dev/null 2>&1 </dev/null &
	WATCHDOG=$!
}

# build: bin/pegad, bin/pegactl (version-stamped, as `make build` does) and
# the lock client.
build() {
	log "building bin/pegad bin/pegactl"
	(cd "$ROOT" && make -s build && go build -o "$WORK/lockclient" ./scripts/lockclient)
	PEGAD=$ROOT/bin/pegad
	PEGACTL=$ROOT/bin/pegactl
	LOCKCLIENT=$WORK/lockclient
}

# free_port prints a loopback TCP port free at the time of the call.
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_pegad NAME ARGS...: starts `pegad serve ARGS` logging to
# $WORK/NAME.log; sets PID_<NAME>. Wait with wait_ready.
start_pegad() {
	local name=$1
	shift
	"$PEGAD" serve "$@" >"$WORK/$name.log" 2>&1 &
	local pid=$!
	PIDS+=("$pid")
	LOGS+=("$WORK/$name.log")
	printf -v "PID_$name" '%s' "$pid"
	log "started pegad $name (pid $pid)"
}

# wait_until SECONDS DESCRIPTION CMD...: retries CMD (a command or a shell
# function) every 100 ms.
wait_until() {
	local limit=$1 what=$2
	shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1 </dev/null; do
		((SECONDS < end)) || fail "timed out after ${limit}s waiting for: $what"
		sleep 0.1
	done
}

# wait_ready PID SOCKET: until pegactl gets stats, failing fast if pegad dies.
wait_ready() {
	local pid=$1 sock=$2 end=$((SECONDS + 30))
	until "$PEGACTL" --socket "$sock" --timeout 2s stats >/dev/null 2>&1; do
		kill -0 "$pid" 2>/dev/null || fail "pegad (pid $pid) exited during start-up"
		((SECONDS < end)) || fail "pegad on $sock not ready after 30s"
		sleep 0.1
	done
}

# stop_pegad PID: SIGTERM, then it must exit 0 within 20 s.
stop_pegad() {
	local pid=$1 end=$((SECONDS + 20))
	kill -TERM "$pid"
	while kill -0 "$pid" 2>/dev/null; do
		((SECONDS < end)) || fail "pegad (pid $pid) still running 20s after SIGTERM"
		sleep 0.1
	done
	local rc=0
	wait "$pid" || rc=$?
	[[ $rc -eq 0 ]] || fail "pegad (pid $pid) exited $rc after SIGTERM, want 0"
}

# jq_py EXPR: evaluates a Python expression over the JSON on stdin (bound
# to d) and prints the result; JSON-encodes lists, dicts and booleans.
jq_py() {
	python3 -c '
import json, sys
d = json.load(sys.stdin)
v = eval(sys.argv[1], {"d": d, "len": len, "sum": sum, "any": any, "all": all})
print(json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else v)
' "$1"
}

# check DESCRIPTION EXPR: EXPR over the JSON on stdin must be true.
check() {
	local what=$1 expr=$2 json
	json=$(cat)
	if [[ $(jq_py "$expr" <<<"$json") != "true" ]]; then
		echo "$json" >&2
		fail "$what: ($expr) is not true"
	fi
	pass "$what"
}

# no_sessions SOCKET: true when pegad on SOCKET holds no holder session:
# none listed (a lapsed one leaves the listing at its deadline) and none
# still counted active (the sweeper has ended it and unpinned its blocks).
no_sessions() {
	"$PEGACTL" --socket "$1" -o json sessions list |
		python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["sessions"] == [] else 1)' &&
		"$PEGACTL" --socket "$1" -o json stats |
		python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["sessions_active"] == 0 else 1)'
}

# metric_at_least URL NAME MIN: true when the sample is at least MIN.
metric_at_least() {
	python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$(metric "$1" "$2")" "$3"
}

# metric URL NAME[{LABELS}]: prints the value of one sample (0 when absent).
metric() {
	python3 - "$1" "$2" <<'PY'
import sys, urllib.request
url, want = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(url, timeout=5).read().decode()
total = 0.0
for line in text.splitlines():
    if line.startswith("#") or not line.strip():
        continue
    name, _, value = line.rpartition(" ")
    if name == want:
        total = float(value)
        break
print(int(total) if total == int(total) else total)
PY
}

# random_file PATH BYTES
random_file() { head -c "$2" /dev/urandom >"$1"; }

# random_hash prints 16 random bytes in hex.
random_hash() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

# block_files DIR NAME MODE SIZE...: random segment files DIR/NAME.0, .1, ...
# and their concatenation DIR/NAME.expect (what a get must return). MODE k:
# one K segment per file; kv: consecutive files are one slot's K and V.
# Sets BLOCK_ARGS to pegactl's matching --file/--kv flags.
block_files() {
	local dir=$1 name=$2 mode=$3 i=0 size
	shift 3
	BLOCK_ARGS=()
	: >"$dir/$name.expect"
	for size in "$@"; do
		random_file "$dir/$name.$i" "$size"
		cat "$dir/$name.$i" >>"$dir/$name.expect"
		BLOCK_ARGS+=(--file "$dir/$name.$i")
		i=$((i + 1))
	done
	if [[ $mode == kv ]]; then BLOCK_ARGS+=(--kv); fi
}
