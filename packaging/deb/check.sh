#!/usr/bin/env bash
# CI: installs the amd-gpud package into a Debian bookworm root made by debootstrap, checks
# its files, the user 60700, `systemd-analyze verify` and `security` of the installed unit,
# then purges it and checks that nothing of it is left.
#   packaging/deb/check.sh target/packaging/amd-gpud_<version>_amd64.deb
#   packaging/deb/check.sh --prepare-root   only make the cached root (CI runs it during the build)
# The root (minbase + systemd + dbus, the package's dependencies) is made once and kept as a
# tarball under ~/.cache/amd-gpu-ci (AMD_GPU_CI_CACHE), outside the clone; a cold run makes it
# from the Debian mirror this machine's apt uses (DEBIAN_MIRROR overrides).
# Needs root (chroot, mount).
set -euo pipefail
# shellcheck source=packaging/common.sh
. "$(dirname "$0")/../common.sh"

deb=${1:-}
prepare_only=0
if [ "$deb" = --prepare-root ]; then
    prepare_only=1
else
    [ -f "$deb" ] || die "usage: $0 PACKAGE.deb|--prepare-root (got '$deb', not a file)"
    deb=$(readlink -f "$deb")
fi
[ "$(id -u)" = 0 ] || die "needs root (chroot and mount), running as UID $(id -u)"
need debootstrap:debootstrap chroot:coreutils systemd-analyze:systemd

suite=bookworm
include=systemd,dbus
# The first deb.debian.org-style URI of the host's apt sources (deb822 or one-line format).
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ') || true
fi
[ -n "$mirror" ] || die "no Debian mirror (…/debian) in /etc/apt/sources.list*: set DEBIAN_MIRROR"

cache_dir=${AMD_GPU_CI_CACHE:-$HOME/.cache/amd-gpu-ci}
key=$(printf '%s %s %s' "$suite" "$include" "$mirror" | md5sum | cut -c1-12)
tarball=$cache_dir/debootstrap-$suite-$key.tar

work=$(mktemp -d /var/tmp/amd-gpud-deb-check.XXXXXX)
root=$work/root
cleanup_mounts() {
    local m
    # Lazy, so that a busy mount cannot fail the cleanup.
    for m in "$root/dev" "$root/sys" "$root/proc"; do
        if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
    done
    # Never delete through a mount that is still there (/dev of the host).
    ! grep -qF " $root/" /proc/self/mounts || die "mounts left under $root: not removing it"
}
cleanup() {
    cleanup_mounts && rm -rf "$work"
}
trap cleanup EXIT

if [ ! -f "$tarball" ]; then
    echo "== debootstrap $suite (minbase + $include) from $mirror; cached as $tarball"
    mkdir -p "$root"
    debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
    chroot "$root" apt-get clean
    mkdir -p "$cache_dir"
    # A temporary name, then a rename: a run that dies half-way leaves no truncated cache.
    tar -cf "$tarball.$$.tmp" -C "$root" . && mv "$tarball.$$.tmp" "$tarball"
    rm -rf "$root"
fi
[ "$prepare_only" = 0 ] || { echo "$tarball"; exit 0; }

# A fresh root from the tarball, with /proc, /sys and /dev (systemd-analyze, getent).
fresh_root() {
    cleanup_mounts
    rm -rf "$root"
    mkdir -p "$root"
    tar -xf "$tarball" -C "$root"
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --bind /dev "$root/dev"
}
echo "== $suite root from $tarball"
fresh_root

in_root() { chroot "$root" "$@"; }
fail=0
ok() { echo "  ok    $*"; }
bad() {
    echo "  FAIL  $*" >&2
    fail=1
}

# What the root holds before the package, to compare with after its purge.
snapshot() {
    in_root find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -print | sort
}
snapshot >"$work/before"
in_root systemd --version | head -n 1

echo "== dpkg -i $(basename "$deb") (no systemd running: a chroot)"
cp "$deb" "$root/tmp/"
if ! in_root dpkg -i "/tmp/$(basename "$deb")"; then
    die "dpkg -i failed in the $suite root"
fi
rm -f "$root/tmp/$(basename "$deb")"

echo "== installed files"
for entry in \
    0755:/usr/bin/amd-gpud \
    0755:/usr/bin/amd-gpud-loader-check \
    0644:/usr/lib/systemd/system/amd-gpud.service \
    0644:/usr/share/dbus-1/system.d/io.hami.AmdGpu1.conf \
    0644:/usr/lib/sysusers.d/amd-gpud.conf \
    0644:/usr/lib/tmpfiles.d/amd-gpud.conf \
    0755:/usr/lib/systemd/system-generators/amd-gpud-sysfs-generator; do
    mode=${entry%%:*}
    path=${entry#*:}
    have=$(stat -c '%a %U:%G' "$root$path" 2>/dev/null || echo missing)
    if [ "$have" = "${mode#0} root:root" ]; then ok "$path ($have)"; else bad "$path: $have, want ${mode#0} root:root"; fi
done
for dir in /etc/cdi /run/cdi; do
    if [ -d "$root$dir" ]; then ok "$dir made by systemd-tmpfiles"; else bad "$dir missing"; fi
done
wants=/etc/systemd/system/multi-user.target.wants/amd-gpud.service
if [ -L "$root$wants" ]; then ok "enabled offline ($wants)"; else bad "not enabled: no $wants"; fi

echo "== the binaries run in the $suite root"
for program in amd-gpud amd-gpud-loader-check; do
    if out=$(in_root "/usr/bin/$program" --version 2>&1); then ok "$program --version: $out"; else bad "$program --version: $out"; fi
done

echo "== the plugin's user"
pw=$(in_root getent passwd "$PLUGIN_USER" || true)
gr=$(in_root getent group "$PLUGIN_USER" || true)
if [ "$(echo "$pw" | cut -d: -f3,4)" = "$PLUGIN_UID:$PLUGIN_UID" ]; then ok "passwd: $pw"; else bad "passwd entry '$pw', want UID/GID $PLUGIN_UID"; fi
if [ "$(echo "$gr" | cut -d: -f3)" = "$PLUGIN_UID" ]; then ok "group: $gr"; else bad "group entry '$gr', want GID $PLUGIN_UID"; fi

echo "== systemd-analyze verify amd-gpud.service (the root's systemd)"
if out=$(in_root systemd-analyze verify /usr/lib/systemd/system/amd-gpud.service 2>&1) && [ -z "$out" ]; then
    ok "verify: no warning"
else
    bad "verify: ${out:-exit status non-zero}"
fi
echo "== systemd-analyze security --offline=true (threshold 2.0, as .ci/unit-security)"
if out=$(in_root systemd-analyze security --offline=true --threshold=20 --no-pager \
    /usr/lib/systemd/system/amd-gpud.service 2>&1); then
    ok "$(echo "$out" | grep -F 'Overall exposure level')"
else
    bad "security: $(echo "$out" | tail -n 3)"
fi

echo "== dpkg --purge amd-gpud"
# A stale CDI spec, as a running amd-gpud would have left it: the purge must remove it.
echo '{}' >"$root/run/cdi/amd.com-gpu.json"
in_root dpkg --purge amd-gpud || die "dpkg --purge failed"
snapshot >"$work/after"
# Expected differences: the user (Debian leaves system users; postrm says why), dpkg's and
# the shadow tools' own records, and the marker systemd-analyze verify (above) leaves.
left=$(comm -13 "$work/before" "$work/after" |
    grep -vE '^/(etc/(passwd|group|shadow|gshadow)-?|var/lib/dpkg/.*|var/log/dpkg\.log|var/log/alternatives\.log|run/systemd/systemd-units-load)$' || true)
gone=$(comm -23 "$work/before" "$work/after" || true)
if [ -z "$left" ]; then ok "no file left behind"; else bad "left behind after purge: $left"; fi
if [ -z "$gone" ]; then ok "nothing of the root removed"; else bad "removed by the package: $gone"; fi
if in_root getent passwd "$PLUGIN_USER" >/dev/null; then ok "user $PLUGIN_USER kept (documented)"; fi
if in_root dpkg -s amd-gpud >/dev/null 2>&1; then bad "dpkg still knows amd-gpud"; else ok "dpkg has no record of amd-gpud"; fi

# The chart's node installer does what the package does, from its image's files and shell
# (INSTALLER_ROOTFS: the unpacked amd-gpud-node-installer image, from packaging/image/check.sh),
# with chroot standing in for nsenter into the host's PID 1.
if [ -n "${INSTALLER_ROOTFS:-}" ]; then
    [ -x "$INSTALLER_ROOTFS/bin/sh" ] || die "INSTALLER_ROOTFS '$INSTALLER_ROOTFS' has no /bin/sh"
    echo "== node installer (its image's busybox sh) on a fresh $suite root"
    fresh_root
    snapshot >"$work/before"
    installer() {
        env -i PATH="$INSTALLER_ROOTFS/bin" HOST_ROOT="$root" HOST_EXEC="chroot $root /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin" \
            SRC="$INSTALLER_ROOTFS/usr/share/amd-gpud-node-installer/root" \
            "$INSTALLER_ROOTFS/bin/sh" "$INSTALLER_ROOTFS/usr/share/amd-gpud-node-installer/node-installer.sh" "$@"
    }
    installer install || die "node-installer.sh install failed"
    (cd "$INSTALLER_ROOTFS/usr/share/amd-gpud-node-installer/root" && find . ! -type d) | while read -r f; do
        cmp -s "$INSTALLER_ROOTFS/usr/share/amd-gpud-node-installer/root/$f" "$root/$f" || echo "$f"
    done >"$work/differ"
    if [ ! -s "$work/differ" ]; then ok "installed every file of the package"; else bad "not installed: $(cat "$work/differ")"; fi
    pw=$(in_root getent passwd "$PLUGIN_USER" | cut -d: -f3,4 || true)
    if [ "$pw" = "$PLUGIN_UID:$PLUGIN_UID" ]; then ok "created $PLUGIN_USER $pw"; else bad "user $PLUGIN_USER: '$pw'"; fi
    if [ -L "$root$wants" ] && [ -d "$root/etc/cdi" ]; then ok "enabled, /etc/cdi made"; else bad "not enabled or no /etc/cdi"; fi
    out=$(installer install 2>&1) || die "a second node-installer.sh install failed: $out"
    if echo "$out" | grep -q unchanged; then ok "a second install changes nothing"; else bad "second install: $out"; fi
    echo '{}' >"$root/run/cdi/amd.com-gpu.json"
    installer prestop || die "node-installer.sh prestop failed"
    snapshot >"$work/after"
    left=$(comm -13 "$work/before" "$work/after" | grep -vE '^/etc/(passwd|group|shadow|gshadow)-?$' || true)
    gone=$(comm -23 "$work/before" "$work/after" || true)
    if [ -z "$left" ]; then ok "uninstall (prestop) left no file behind"; else bad "left behind by the installer: $left"; fi
    if [ -z "$gone" ]; then ok "uninstall removed nothing else"; else bad "removed by the installer: $gone"; fi
fi

[ "$fail" = 0 ] || die "the package check failed (see FAIL above)"
echo "package check: ok"
