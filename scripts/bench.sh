#!/usr/bin/env bash
# bench.sh: pegad's performance figures, each beside a baseline measured in
# the same run (absolute times on a shared machine are noise; a ratio of two
# figures measured side by side is not).
#
#   scripts/bench.sh        # the curated pairs below, then a table:
#                           #   pair | subject | baseline | ratio | better
#   scripts/bench.sh all    # every Benchmark in the module, raw go test output
#
# Environment: BENCHTIME (go test -benchtime, default 1s), BENCHCOUNT (runs
# of each benchmark, default 5 for the pairs, the table shows medians; 1
# for all), GO (default go).
# Raw output is kept in bin/bench-current.txt (git-ignored).
#
# Each pair is one Benchmark that times its subject and its baseline in the
# same iterations and reports both with b.ReportMetric; the ratio is
# subject/baseline of each run, and the table shows the median of those.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
# -tags of the test builds (the Makefile's TEST_TAGS): the fake HCA.
TEST_TAGS=${TEST_TAGS-pegad_fakeverbs}
BENCHTIME=${BENCHTIME:-1s}
mkdir -p bin
RAW=bin/bench-current.txt

if [[ ${1:-} == all ]]; then
	exec "$GO" test -tags="$TEST_TAGS" -run='^$' -bench=. -benchmem -benchtime="$BENCHTIME" -count="${BENCHCOUNT:-1}" ./...
fi
BENCHCOUNT=${BENCHCOUNT:-5}

# The pairs. Fields (|-separated): label | package | benchmark (as go test
# prints it, without the -GOMAXPROCS suffix) | subject metric | baseline
# metric | which ratio is better (higher, lower, or ~1).
PAIRS=(
	"tcp provider READ 64MiB vs plain TCP, 1 QP|./internal/ibv/tcp|BenchmarkReadVsTCP/qps=1|provider-MB/s|plain-tcp-MB/s|higher"
	"tcp provider READ 64MiB vs plain TCP, 4 QPs|./internal/ibv/tcp|BenchmarkReadVsTCP/qps=4|provider-MB/s|plain-tcp-MB/s|higher"
	"one 8MiB segment sliced in 1MiB WRs vs one WR (tcp, 2 NICs x 2 QPs)|./internal/conn|BenchmarkSliceVsWhole/segs=1|sliced-MB/s|whole-MB/s|higher"
	"4 x 8MiB segments sliced in 1MiB WRs vs one WR each (tcp, 2 NICs x 2 QPs)|./internal/conn|BenchmarkSliceVsWhole/segs=4|sliced-MB/s|whole-MB/s|~1"
	"query+release 32 blocks vs gRPC echo|./bench|BenchmarkLockVsEcho|lock-ns/op|echo-ns/op|lower"
	"prefetch 16x4MiB (2 daemons) vs plain TCP|./bench|BenchmarkPrefetchVsTCP|prefetch-MB/s|tcp-MB/s|higher"
	"pegactl prefetch 145x4MiB in lock windows (cap 350MiB, 1 QP) vs 1 TCP stream|./bench|BenchmarkPrefetchWindowsVsTCP|windows-MB/s|tcp-MB/s|higher"
	"pegactl bench fetch sweep (2 daemons, tcp) vs plain TCP|./bench|BenchmarkBenchFetchVsTCP|benchfetch-MB/s|tcp-MB/s|higher"
	"local PutBlock 4MiB vs raw unix stream|./bench|BenchmarkLocalPutGetVsUnix|put-MB/s|unix-MB/s|higher"
	"local GetBlock 4MiB vs raw unix stream|./bench|BenchmarkLocalPutGetVsUnix|get-MB/s|unix-MB/s|higher"
	"ExpireBefore 10 of 100k live vs of 1k live|./bench|BenchmarkExpireScaling|live100k-ns/op|live1k-ns/op|~1"
	"query+release 16 blocks, 1 requester vs echo|./bench|BenchmarkControlPlane/blocks=16/requesters=1|lock-ns/op|echo-ns/op|lower"
	"query+release 16 blocks, 64 requesters vs echo|./bench|BenchmarkControlPlane/blocks=16/requesters=64|lock-ns/op|echo-ns/op|lower"
	"query+release 150 blocks, 1 requester vs echo|./bench|BenchmarkControlPlane/blocks=150/requesters=1|lock-ns/op|echo-ns/op|lower"
	"query+release 150 blocks, 64 requesters vs echo|./bench|BenchmarkControlPlane/blocks=150/requesters=64|lock-ns/op|echo-ns/op|lower"
	"sweeper tick, 1M live, expires none vs 1k live|./bench|BenchmarkSessionsAtScale|tick1m-ns/op|tick1k-ns/op|~1"
	"query+release p99 with 1ms sweeper vs none (1M)|./bench|BenchmarkSessionsAtScale|p99sweep-ns/op|p99idle-ns/op|~1"
	"heap per live session vs bare map entry (1M)|./bench|BenchmarkSessionsAtScale|session-B/op|mapentry-B/op|lower"
	"client.Put 4MiB vs memcpy in|./bench|BenchmarkClientPutGetVsMemcpy|put-MB/s|memcpyin-MB/s|higher"
	"client.Get 4MiB vs memcpy out|./bench|BenchmarkClientPutGetVsMemcpy|get-MB/s|memcpyout-MB/s|higher"
	"AllocBatch+CommitBatch per block vs echo|./bench|BenchmarkClientBatchLeases|alloccommit-ns/op|echo-ns/op|lower"
	"LeaseBatch+ReleaseBatch per block vs echo|./bench|BenchmarkClientBatchLeases|leaserelease-ns/op|echo-ns/op|lower"
	"lookup of a 1,000-hash chain vs an empty round trip|./bench|BenchmarkLookupChainVsEmpty|lookup1000-ns/op|empty-ns/op|lower"
	"verbs READ latency (fake HCA, completions 50us late) vs that delay|./internal/ibv/verbs|BenchmarkReadLatencyVsDelay|read-us|delay-us|lower"
	"pool start-up (map + parallel populate) s/GiB vs one-thread memset|./internal/pool|BenchmarkPoolStartVsMemset|start-s/GiB|memset-s/GiB|lower"
	"SSD tier warm start (full 128MiB log, 64KiB blocks) vs sequential read of its headers|./internal/ssd|BenchmarkOpenVsHeaderRead|open-ms|headers-ms|~1"
	"SSD tier sequential write of 1MiB blocks (QD1, direct) vs fio|./internal/ssd|BenchmarkTierVsFio/write|tier-MB/s|fio-MB/s|higher"
	"SSD tier random single-block reads (QD4, direct, CRC checked) vs fio|./internal/ssd|BenchmarkTierVsFio/randread|tier-MB/s|fio-MB/s|higher"
	"python put 4MiB vs numpy copy in|clients/python|BenchmarkPythonPutGetVsNumpy|put-MB/s|numpyin-MB/s|higher"
	"python get 4MiB vs numpy copy out|clients/python|BenchmarkPythonPutGetVsNumpy|get-MB/s|numpyout-MB/s|higher"
	"python put 4MiB vs numpy copy into uncached memory|clients/python|BenchmarkPythonPutGetVsNumpy|put-MB/s|numpycold-MB/s|higher"
	"vllm connector load 1000 blocks vs numpy scatter|clients/python/connectors|BenchmarkConnectorLoadSave1000|load-MB/s|numpyload-MB/s|higher"
	"vllm connector save 1000 blocks vs numpy gather|clients/python/connectors|BenchmarkConnectorLoadSave1000|save-MB/s|numpysave-MB/s|higher"
	"vllm connector empty step vs no-op connector|clients/python/connectors|BenchmarkConnectorEmptyStep|step-ns/op|noop-ns/op|lower"
)

# One go test run per package, selecting the pairs' top-level benchmarks.
declare -A BENCHES
PKGS=()
for p in "${PAIRS[@]}"; do
	IFS='|' read -r _ pkg bench _ <<<"$p"
	top=${bench%%/*}
	if [[ -z ${BENCHES[$pkg]+x} ]]; then
		PKGS+=("$pkg")
		BENCHES[$pkg]=$top
	elif [[ "|${BENCHES[$pkg]}|" != *"|$top|"* ]]; then
		BENCHES[$pkg]+="|$top"
	fi
done

: >"$RAW"
failed=0
start=$SECONDS
for pkg in "${PKGS[@]}"; do
	echo "==> $pkg: ${BENCHES[$pkg]} (benchtime $BENCHTIME, count $BENCHCOUNT)"
	# The package path goes before the output so the parser can tell apart
	# same-named benchmarks of different packages.
	echo "bench.sh-package: $pkg" >>"$RAW"
	set +e
	if [[ $pkg == clients/python || $pkg == clients/python/connectors ]]; then
		# The Python client's row: a script printing go test's format, run
		# by Debian's python3 (python3-grpcio, -protobuf, -numpy) on the
		# package's source tree against a pegad it builds and starts.
		script=clients/python/tests/bench_putget.py
		[[ $pkg == clients/python/connectors ]] && script=clients/python/tests/bench_connector.py
		PYTHONPATH=clients/python GO="$GO" "${PYTHON:-/usr/bin/python3}" "$script" \
			--benchtime "$BENCHTIME" --count "$BENCHCOUNT" 2>&1 | tee -a "$RAW" | grep --line-buffered -E '^(Benchmark|Traceback|[A-Za-z]*Error)'
	else
		"$GO" test -tags="$TEST_TAGS" -run='^$' -bench="^(${BENCHES[$pkg]})\$" -benchtime="$BENCHTIME" -count="$BENCHCOUNT" \
			"$pkg" 2>&1 | tee -a "$RAW" | grep --line-buffered -E '^(Benchmark|--- FAIL|FAIL|panic|ok )'
	fi
	status=${PIPESTATUS[0]}
	set -e
	if ((status != 0)); then
		echo "    $pkg: go test failed (exit $status; see $RAW)"
		failed=1
	fi
done
echo "    ($((SECONDS - start)) s; raw output in $RAW)"
echo

# Parse: a result line is "Name[-P] N value ns/op value unit ...". A result
# can be split when something prints while the benchmark runs (go test
# prints the name, then that output, then the figures): a Benchmark line
# without figures is remembered and joined with the next line that has them.
printf '%s\n' "${PAIRS[@]}" >bin/bench-pairs.txt
awk -v count="$BENCHCOUNT" '
function strip(name) { sub(/-[0-9]+$/, "", name); return name }
function median(list,    a, n, i, j, t) {
	n = split(list, a, " ")
	if (n == 0) return ""
	for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] + 0 : (a[n/2] + a[n/2+1]) / 2
}
function fmt(v, unit) {
	if (v == "") return "-"
	if (unit ~ /ns\/op$/) {
		if (v >= 1e6) return sprintf("%.2f ms/op", v / 1e6)
		if (v >= 1e4) return sprintf("%.1f us/op", v / 1e3)
		return sprintf("%.0f ns/op", v)
	}
	return sprintf("%.0f %s", v, unit)
}
function unitof(metric) { return (metric ~ /MB\/s$/) ? "MB/s" : (metric ~ /ns\/op$/) ? "ns/op" : metric }
# The pair definitions come first, in their own file.
FNR == NR {
	split($0, f, "|")
	np++; label[np] = f[1]; pkg[np] = f[2]; bench[np] = f[3]; subj[np] = f[4]; base[np] = f[5]; better[np] = f[6]
	next
}
/^bench\.sh-package: / { curpkg = $2; pending = ""; next }
{
	if ($1 ~ /^Benchmark/ && $0 !~ /[ \t]ns\/op([ \t]|$)/) { pending = $1; next }   # figures to follow
	for (first = 1; first <= NF && $first != "ns/op"; first++) {}
	if (first > NF) next
	first--                                # the ns/op value; metrics are value-unit pairs from here
	if ($1 ~ /^Benchmark/) name = $1
	else if (pending != "") name = pending
	else next
	pending = ""
	name = strip(name)
	delete m
	for (i = first; i < NF; i += 2) m[$(i+1)] = $i
	for (k = 1; k <= np; k++) {
		if (pkg[k] != curpkg || bench[k] != name) continue
		if (!(subj[k] in m) || !(base[k] in m)) continue
		s = m[subj[k]] + 0; b = m[base[k]] + 0
		svals[k] = svals[k] " " s; bvals[k] = bvals[k] " " b; runs[k]++
		if (b > 0) rvals[k] = rvals[k] " " (s / b)
	}
}
END {
	printf "%-45s %14s %14s %7s  %-7s %s\n", "pair (subject vs baseline)", "subject", "baseline", "ratio", "better", "runs"
	for (k = 1; k <= np; k++) {
		u = unitof(subj[k])
		if (!runs[k]) { printf "%-45s %14s %14s %7s  %-7s %s\n", label[k], "-", "-", "n/a", better[k], "0 (no result)"; missing++; continue }
		r = median(rvals[k])
		printf "%-45s %14s %14s %7s  %-7s %d\n", label[k], fmt(median(svals[k]), u), fmt(median(bvals[k]), unitof(base[k])),
			(r == "" ? "n/a" : sprintf("%.2f", r)), better[k], runs[k]
	}
	printf "\nmedians of the runs (BENCHCOUNT=%d); ratio = subject/baseline per run (median). higher: throughput pairs (1 = no\n", count
	printf "overhead over the plain stream); lower: latency pairs (1 = no overhead over the bare echo); ~1: scaling pair\n"
	printf "(cost independent of the number of live sessions). Absolute figures are noise on a shared machine.\n"
	exit (missing ? 2 : 0)
}' bin/bench-pairs.txt "$RAW" || failed=1
exit "$failed"
