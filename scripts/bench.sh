#!/usr/bin/env bash
# bench.sh: runs every Benchmark in the module and prints each result next
# to the saved baseline (bench/baseline.txt) with the ns/op change.
#   scripts/bench.sh            # run, compare, write bin/bench-current.txt (ignored)
#   BENCH_SAVE=1 scripts/bench.sh   # also make this run the new baseline
#   BENCHTIME=2s BENCHCOUNT=3 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BENCHTIME=${BENCHTIME:-1s}
BENCHCOUNT=${BENCHCOUNT:-1}
mkdir -p bench bin
"$GO" test -run='^$' -bench=. -benchmem -benchtime="$BENCHTIME" -count="$BENCHCOUNT" ./... | tee bin/bench-current.txt
echo
if [[ -f bench/baseline.txt ]]; then
	# Average ns/op per benchmark name (over -count runs), joined on name.
	awk '
	function key(l) { return l }
	FNR == 1 { file++ }
	/^pkg: / { pkg = $2; next }
	/^Benchmark/ {
		for (i = 3; i <= NF; i++) if ($(i+1) == "ns/op") { ns = $i; break }
		k = pkg "." $1; sum[file, k] += ns; n[file, k]++; names[k] = 1
	}
	END {
		printf "%-70s %14s %14s %9s\n", "benchmark", "baseline ns/op", "current ns/op", "delta"
		for (k in names) {
			b = (n[1, k] ? sum[1, k] / n[1, k] : 0); c = (n[2, k] ? sum[2, k] / n[2, k] : 0)
			d = (b > 0 && c > 0) ? sprintf("%+.1f%%", (c - b) / b * 100) : "n/a"
			printf "%-70s %14s %14s %9s\n", k, (b ? sprintf("%.1f", b) : "-"), (c ? sprintf("%.1f", c) : "-"), d
		}
	}' bench/baseline.txt bin/bench-current.txt | { read -r h; echo "$h"; sort; }
else
	echo "no bench/baseline.txt yet: run BENCH_SAVE=1 $0 to record one"
fi
if [[ ${BENCH_SAVE:-0} == 1 ]]; then
	cp bin/bench-current.txt bench/baseline.txt
	echo "saved bench/baseline.txt"
fi
