#!/usr/bin/env bash
# make install into temporary directories and check what landed: every file
# in its place with its mode, the unit pointing at the installed binary and
# config (and passing systemd-analyze verify when systemd is present), the
# installed config passing `pegad config check`, a re-install keeping an
# edited config, and uninstall removing the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install-check: FAIL: $*" >&2; exit 1; }

# 1. A package build: DESTDIR staging, default PREFIX.
stage=$tmp/stage
make -s install DESTDIR="$stage" >/dev/null
for f in usr/local/bin/pegad usr/local/bin/pegactl; do
	[[ -x $stage/$f ]] || fail "$f missing or not executable"
done
for f in usr/local/lib/systemd/system/pegad.service etc/pegad/pegad.yaml \
	usr/local/share/bash-completion/completions/pegactl usr/local/share/zsh/site-functions/_pegactl \
	usr/local/share/fish/vendor_completions.d/pegactl.fish \
	usr/local/share/pegad/prometheus/alerts.yaml usr/local/share/pegad/grafana/pegad.json; do
	[[ -s $stage/$f ]] || fail "$f missing or empty"
	[[ $(stat -c %a "$stage/$f") == 644 ]] || fail "$f mode $(stat -c %a "$stage/$f"), want 644"
done
grep -qx 'ExecStart=/usr/local/bin/pegad serve --config /etc/pegad/pegad.yaml' \
	"$stage/usr/local/lib/systemd/system/pegad.service" || fail "unit ExecStart does not name the installed paths"
grep -q '^# bash completion V2 for pegactl' "$stage/usr/local/share/bash-completion/completions/pegactl" ||
	fail "bash completion is not pegactl's"

# Re-install over an edited config: kept, the shipped one beside it.
echo "# edited by the operator" >>"$stage/etc/pegad/pegad.yaml"
make -s install DESTDIR="$stage" >/dev/null
grep -q '^# edited by the operator' "$stage/etc/pegad/pegad.yaml" || fail "re-install overwrote an edited config"
[[ -s $stage/etc/pegad/pegad.yaml.new ]] || fail "re-install did not leave pegad.yaml.new"

make -s uninstall DESTDIR="$stage" >/dev/null
left=$(cd "$stage" && find . -type f | sort | tr '\n' ' ')
[[ $left == "./etc/pegad/pegad.yaml ./etc/pegad/pegad.yaml.new " ]] || fail "uninstall left: $left"

# 2. A PREFIX install: the unit names PREFIX's binary and SYSCONFDIR's config.
prefix=$tmp/prefix
make -s install PREFIX="$prefix" SYSCONFDIR="$prefix/etc" >/dev/null
unit=$prefix/lib/systemd/system/pegad.service
grep -qx "ExecStart=$prefix/bin/pegad serve --config $prefix/etc/pegad/pegad.yaml" "$unit" ||
	fail "PREFIX unit ExecStart: $(grep ExecStart= "$unit")"
"$prefix/bin/pegad" config check "$prefix/etc/pegad/pegad.yaml" >/dev/null || fail "installed config fails pegad config check"
"$prefix/bin/pegactl" completion fish >/dev/null || fail "installed pegactl"
if command -v systemd-analyze >/dev/null; then
	out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
	[[ -z $out ]] || fail "systemd-analyze verify: $out"
else
	echo "install-check: systemd-analyze not found; unit not verified"
fi
echo "install-check: ok"
