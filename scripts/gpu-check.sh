#!/usr/bin/env bash
# make gpu-check: the device tests with PEGAD_DEVICE=cuda and the
# connector's CUDA path (clients/python/tests/gpu_check.py), on a machine
# with a GPU. Builds a stripped pegad into .gpu-check/ where Go is present
# (carry only that folder to a GPU machine without Go); runs the client
# from clients/python on PYTHONPATH. Without CUDA it says so and exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .gpu-check
if command -v "${GO:-go}" >/dev/null; then
	"${GO:-go}" build -ldflags='-s -w' -o .gpu-check/pegad ./cmd/pegad
fi
[[ -x .gpu-check/pegad ]] || { echo "gpu-check: no .gpu-check/pegad (build it where Go is)"; exit 1; }
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
	echo "gpu-check: no CUDA device here (torch.cuda.is_available() is False): nothing checked"
	exit 2
fi
export PYTHONPATH=$PWD/clients/python:$PWD/clients/python/tests/stubs PEGAD_BIN=$PWD/.gpu-check/pegad
timeout 240 env PEGAD_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider clients/python/tests/test_device.py
timeout 120 "$PY" clients/python/tests/gpu_check.py
