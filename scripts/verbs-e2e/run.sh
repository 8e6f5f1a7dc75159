#!/usr/bin/env bash
# verbs-e2e/run.sh: pegad's verbs provider on a real verbs stack.
#
# The host has no RDMA. Debian 12's 6.1 kernel has rdma_rxe (soft-RoCE), and
# with rdma-core 44 and perftest it boots under qemu-system-x86_64 (TCG, no
# KVM) from a busybox initramfs. Everything the guest runs comes from Debian's
# packages (apt-get download) plus bin/pegad and bin/pegactl built here.
# guest-init.sh is the guest's /init: it runs the checks and prints lines
# starting with "VE2E " that this script gathers into a summary.
#
# Cache (gitignored): $CACHE (default bin/verbs-e2e) holds the .debs, the
# kernel and the base initramfs; only pegad, pegactl and /init are rebuilt
# per run (a second cpio appended to the base one: the kernel unpacks both).
#
# Env: CACHE=dir  BOOT_TIMEOUT=seconds (default 540)  MEM=MiB (default 2048)
#      KEEP_LOG=file (copy of the guest's console log)
set -euo pipefail
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/verbs-e2e
CACHE=${CACHE:-$ROOT/bin/verbs-e2e}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-540}
MEM=${MEM:-2048}
GO=${GO:-go}
# -tags of the test binaries (the Makefile's TEST_TAGS): conn.test's windows
# tests run over the fake HCA and rxe0 both.
TEST_TAGS=${TEST_TAGS-pegad_fakeverbs}
ARCH=x86_64-linux-gnu
# rdma-core 44 userspace, perftest, iproute2 (rdma, ip) and their libraries.
PKGS="busybox-static libibverbs1 ibverbs-providers ibverbs-utils perftest iproute2
      librdmacm1 libibumad3 libpci3 libnl-3-200 libnl-route-3-200 libmnl0 libbsd0
      libmd0 libcap2 libbpf1 libelf1 zlib1g libc6 libtirpc3 libselinux1"
# insmod order: dependencies first. crc32 modules: rxe computes ICRCs with them.
MODS="net/ipv4/udp_tunnel.ko net/ipv6/ip6_udp_tunnel.ko crypto/crc32_generic.ko
      arch/x86/crypto/crc32-pclmul.ko drivers/infiniband/core/ib_core.ko
      drivers/infiniband/core/ib_uverbs.ko drivers/infiniband/sw/rxe/rdma_rxe.ko
      drivers/net/veth.ko"
BINS="usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ib_read_bw usr/bin/rdma bin/ip"

log() { printf '[%s] verbs-e2e: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

for t in qemu-system-x86_64 cpio dpkg-deb apt-get; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install qemu-system-x86 cpio)"
done
mkdir -p "$CACHE/debs"

# --- 1. Debian packages (cached) ----------------------------------------------
fetch_debs() {
	local kpkg
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	if [[ -z "$kpkg" ]]; then
		apt-get update -qq
		kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	fi
	[[ -n "$kpkg" ]] || die "no linux-image-amd64 package known to apt"
	log "downloading $kpkg and rdma-core userspace with apt-get download"
	# shellcheck disable=SC2086 # PKGS is a list
	(cd "$CACHE/debs" && apt-get download "$kpkg" $PKGS >download.log 2>&1) ||
		{ cat "$CACHE/debs/download.log" >&2; die "apt-get download failed"; }
}
ls "$CACHE"/debs/linux-image-*.deb >/dev/null 2>&1 || fetch_debs

# --- 2. kernel + base initramfs (cached, keyed on the .debs and this script) --
key=$( (ls "$CACHE"/debs/*.deb; echo "$MODS $BINS"; sha256sum "$0") | sha256sum | cut -c1-16)
BASE=$CACHE/base-$key.cpio
if [[ ! -f "$BASE" || ! -f "$CACHE/vmlinuz" ]]; then
	log "building the base initramfs (key $key)"
	rm -rf "$CACHE/stage" "$CACHE/root" "$CACHE"/base-*.cpio
	mkdir -p "$CACHE/stage" "$CACHE/root"
	for d in "$CACHE"/debs/*.deb; do dpkg-deb -x "$d" "$CACHE/stage"; done
	S=$CACHE/stage R=$CACHE/root
	kver=$(ls "$S/lib/modules" | head -1)
	cp "$S/boot/vmlinuz-$kver" "$CACHE/vmlinuz"
	mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,lib/$ARCH,usr/lib/$ARCH/libibverbs,lib64,etc/libibverbs.d,proc,sys,dev,tmp,run,lib/modules/"$kver"}
	: >"$R/modlist"
	for m in $MODS; do
		[[ -f "$S/lib/modules/$kver/kernel/$m" ]] || die "module $m missing from the kernel package"
		cp "$S/lib/modules/$kver/kernel/$m" "$R/lib/modules/$kver/"
		basename "$m" >>"$R/modlist"
	done
	cp "$S/bin/busybox" "$R/bin/busybox"
	for a in $("$R/bin/busybox" --list); do [[ -e "$R/bin/$a" ]] || ln -s busybox "$R/bin/$a"; done
	for b in $BINS; do rm -f "$R/bin/$(basename "$b")"; cp "$S/$b" "$R/usr/bin/"; done
	# libibverbs loads the rxe provider named by its .driver file.
	cp "$S/usr/lib/$ARCH/libibverbs/librxe-rdmav34.so" "$R/usr/lib/$ARCH/libibverbs/"
	cp "$S/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"
	# libibverbs.so.1 is dlopened by pegad, so ldd does not list it: copy it too.
	cp -L "$S/usr/lib/$ARCH/libibverbs.so.1" "$R/lib/$ARCH/"
	ldp=$S/usr/lib/$ARCH:$S/lib/$ARCH
	for f in "$R"/usr/bin/* "$R"/usr/lib/$ARCH/libibverbs/*.so "$R/lib/$ARCH/libibverbs.so.1"; do
		LD_LIBRARY_PATH=$ldp ldd "$f" 2>/dev/null | awk '/=>/ {print $3} /^\s*\/lib64/ {print $1}'
	done | sort -u | while read -r lib; do
		[[ -f "$lib" ]] || continue
		case "$lib" in */ld-linux-x86-64.so.2) ;; *) cp -L "$lib" "$R/lib/$ARCH/" ;; esac
	done
	cp -L "$S/lib64/ld-linux-x86-64.so.2" "$R/lib64/"
	(cd "$R" && find . | cpio -o -H newc --quiet) >"$BASE.tmp"
	mv "$BASE.tmp" "$BASE"
	rm -rf "$CACHE/root"
	log "base initramfs $(du -h "$BASE" | cut -f1), kernel $kver"
fi

# --- 3. pegad, pegactl and /init (every run) -----------------------------------
log "building pegad and pegactl"
make -C "$ROOT" -s build GO="$GO" >/dev/null
OV=$CACHE/overlay
rm -rf "$OV" && mkdir -p "$OV/usr/bin" "$OV/lib/$ARCH"
cp "$ROOT/bin/pegad" "$ROOT/bin/pegactl" "$OV/usr/bin/"
# The verbs package's tests, for the memory-window phase (TestMemoryWindowDevice).
(cd "$ROOT" && "$GO" test -tags="$TEST_TAGS" -c -o "$OV/usr/bin/verbs.test" ./internal/ibv/verbs) || die "go test -c ./internal/ibv/verbs"
(cd "$ROOT" && "$GO" test -tags="$TEST_TAGS" -c -o "$OV/usr/bin/conn.test" ./internal/conn) || die "go test -c ./internal/conn"
cp "$HERE/guest-init.sh" "$OV/init" && chmod 0755 "$OV/init"
# pegad's shared libraries, taken from Debian's packages where the base lacks them.
S=$CACHE/stage
[[ -d "$S/lib" ]] || { mkdir -p "$S"; for d in "$CACHE"/debs/*.deb; do dpkg-deb -x "$d" "$S"; done; }
for lib in $(ldd "$ROOT/bin/pegad" "$ROOT/bin/pegactl" "$OV/usr/bin/verbs.test" "$OV/usr/bin/conn.test" 2>/dev/null | awk '/=>/ {print $1}' | sort -u); do
	for dir in "$S/lib/$ARCH" "$S/usr/lib/$ARCH"; do
		[[ -f "$dir/$lib" ]] && { cp -L "$dir/$lib" "$OV/lib/$ARCH/"; break; }
	done
done
INITRD=$CACHE/initrd.cpio
{ cat "$BASE"; (cd "$OV" && find . | cpio -o -H newc --quiet); } >"$INITRD"

# --- 4. boot: two NUMA nodes, one CPU each, no host network ----------------------
half=$((MEM / 2))
GUEST_LOG=$CACHE/guest.log
log "booting the guest (qemu TCG, 2 NUMA nodes, ${MEM} MiB; bounded at ${BOOT_TIMEOUT}s)"
BOOT0=$(date +%s)
set +e
timeout "$BOOT_TIMEOUT" qemu-system-x86_64 -M q35 -cpu max -accel tcg \
	-smp 2,sockets=2,cores=1,threads=1 -m "$MEM" \
	-object memory-backend-ram,id=m0,size=${half}M -object memory-backend-ram,id=m1,size=${half}M \
	-numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1 \
	-kernel "$CACHE/vmlinuz" -initrd "$INITRD" \
	-append 'console=ttyS0 quiet loglevel=3 panic=-1' \
	-display none -monitor none -serial stdio -nic none -no-reboot </dev/null 2>&1 |
	sed -u 's/\r$//' | tee "$GUEST_LOG" | grep --line-buffered -E '^(VE2E|=== )' >&2
QRC=${PIPESTATUS[0]}
set -e
[[ -n "${KEEP_LOG:-}" ]] && cp "$GUEST_LOG" "$KEEP_LOG"
BOOT_S=$(($(date +%s) - BOOT0))
TOTAL_S=$(($(date +%s) - START))

# --- 5. verdict ----------------------------------------------------------------
fails=$(grep -c '^VE2E FAIL' "$GUEST_LOG" || true)
oks=$(grep -c '^VE2E ok' "$GUEST_LOG" || true)
done_line=$(grep -m1 '^VE2E DONE' "$GUEST_LOG" || true)
ratio=$(grep -m1 '^VE2E RATIO' "$GUEST_LOG" | sed 's/^VE2E RATIO //' || true)
status=PASS
[[ $QRC -eq 0 ]] || status=FAIL
[[ -n "$done_line" && $fails -eq 0 ]] || status=FAIL
if [[ $status != PASS ]]; then
	echo "----- guest console (last 150 lines) -----" >&2
	tail -n 150 "$GUEST_LOG" >&2
fi
echo "verbs-e2e: $status: $oks checks ok, $fails failed; ${ratio:-no ib_read_bw ratio}; qemu exit $QRC; boot+tests ${BOOT_S}s, total ${TOTAL_S}s"
[[ $status == PASS ]]
