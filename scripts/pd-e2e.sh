#!/usr/bin/env bash
# make pd-e2e: prefill/decode disaggregation end to end (issue 34; not in
# make test, .ci/run calls it). Two real pegads on loopback (tcp) in one
# cluster index (redis-server, Debian package redis-server), the tiny
# engines through the P/D proxy with the fault cases
# (clients/python/tests/test_pd.py), then the timing sweep of the
# connector's handoff-and-load path against a bare READ of the same bytes
# over 1, 8, 64 and 512 Llama-3-8B-shaped blocks (2 MiB each;
# clients/python/tests/bench_pd.py). Its last line is "pd-e2e: PASS ...".
# PD_SIZES and PD_REPS change the sweep; the client runs from
# clients/python on PYTHONPATH in the Python venv (make python-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
PY_VENV=${PY_VENV:-bin/python-venv}
command -v redis-server >/dev/null || { echo "pd-e2e: redis-server not installed (apt-get install redis-server)"; exit 1; }
[[ -x $PY_VENV/bin/python ]] || make python-venv PY_VENV="$PY_VENV"
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
"$GO" build -o "$bindir/pegad" ./cmd/pegad
"$GO" build -o "$bindir/pegactl" ./cmd/pegactl
export PYTHONPATH=$PWD/clients/python PEGAD_BIN_DIR=$bindir GO
echo "pd-e2e: the tcp test (test_pd.py)"
timeout 600 "$PY_VENV/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests/test_pd.py
echo "pd-e2e: the sweep (bench_pd.py)"
timeout 600 "$PY_VENV/bin/python" clients/python/tests/bench_pd.py --sizes "${PD_SIZES:-1,8,64,512}" \
	--reps "${PD_REPS:-3}" --bin-dir "$bindir"
