#!/usr/bin/env bash
# fuzz.sh: runs every Go fuzz target in the module for a fixed time each.
# Targets are discovered from `func FuzzXxx(f *testing.F)` in *_test.go files,
# so a new target is picked up without editing this script or the Makefile.
#   FUZZTIME=30s scripts/fuzz.sh        # default 10s per target
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}
GO=${GO:-go}
# -tags of the test builds (the Makefile's TEST_TAGS): the fake HCA.
TEST_TAGS=${TEST_TAGS-pegad_fakeverbs}
found=0
failed=()
while IFS=: read -r file _ line; do
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
	pkg=./$(dirname "$file")
	found=$((found + 1))
	echo "==> $pkg $name ($FUZZTIME)"
	if ! "$GO" test -tags="$TEST_TAGS" -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "$pkg"; then
		failed+=("$pkg:$name")
	fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . | sed 's|^\./||' | sort)
echo "fuzz: $found target(s) run for $FUZZTIME each"
if ((${#failed[@]})); then
	echo "fuzz: FAILED: ${failed[*]}" >&2
	exit 1
fi
