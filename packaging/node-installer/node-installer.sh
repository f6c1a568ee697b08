#!/bin/sh
# node-installer.sh: installs amd-gpud's files on the host and enables the unit, idempotently,
# for clusters whose nodes have no package management (the chart's nodeInstaller). It runs in
# a privileged pod with hostPID and the host's / mounted at $HOST_ROOT (/host), from an image
# that carries the files of the Debian package (packaging/deb) under $SRC and a static
# busybox (packaging/image/build.sh). It does what the package's maintainer scripts do:
# user first, then the bus re-reads its policy (systemd/README.md says why), tmpfiles,
# daemon-reload, enable, start.
#
#   node-installer.sh install     copy what differs, then reload/enable/(re)start
#   node-installer.sh uninstall   stop, disable, delete every file install wrote
#   node-installer.sh run         install, then wait for SIGTERM (the DaemonSet's container)
#   node-installer.sh prestop     uninstall, unless the host itself is shutting down
#
# Host commands run in the host's namespaces through PID 1 (nsenter; hostPID makes PID 1 the
# host's init). HOST_EXEC replaces that (tests: HOST_EXEC="chroot /some/root").
# A host where dpkg installed the amd-gpud package is left alone: the package owns the files.
# The user amdgpu-plugin stays on uninstall, as with the package (packaging/deb/postrm).
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
SRC=${SRC:-/usr/share/amd-gpud-node-installer/root}
UNIT=amd-gpud.service

log() { echo "amd-gpud-node-installer: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}
host() {
    if [ -n "${HOST_EXEC:-}" ]; then
        # shellcheck disable=SC2086 # HOST_EXEC is a command with its arguments
        $HOST_EXEC "$@"
    else
        nsenter -t 1 -m -u -i -n -p -- "$@"
    fi
}
# systemd runs on the host (not a chroot or an image build): the check postinst makes too.
systemd_running() { [ -d "$HOST_ROOT/run/systemd/system" ]; }
# The host's package manager owns amd-gpud: do not touch its files.
package_owned() { [ -e "$HOST_ROOT/var/lib/dpkg/info/amd-gpud.list" ]; }
# The package's files, as paths relative to / (usr/bin/amd-gpud ...).
files() { (cd "$SRC" && find . ! -type d | sed 's|^\./||' | sort); }

install_files() {
    [ -d "$SRC" ] || die "no package files in SRC '$SRC'"
    [ -d "$HOST_ROOT/usr" ] || die "HOST_ROOT '$HOST_ROOT' is not the host's root (no usr/): mount / there"
    if package_owned; then
        log "the amd-gpud package is installed on this host (dpkg); leaving it to the package"
        return 0
    fi
    changed=0
    for f in $(files); do
        if cmp -s "$SRC/$f" "$HOST_ROOT/$f"; then continue; fi
        mkdir -p "$HOST_ROOT/$(dirname "$f")"
        # Copy next to the target, then rename: a running amd-gpud or a reading bus never
        # sees a half-written file.
        cp -p "$SRC/$f" "$HOST_ROOT/$f.amd-gpud-new"
        mv -f "$HOST_ROOT/$f.amd-gpud-new" "$HOST_ROOT/$f"
        log "installed /$f"
        changed=1
    done
    host systemd-sysusers /usr/lib/sysusers.d/amd-gpud.conf
    host systemd-tmpfiles --create /usr/lib/tmpfiles.d/amd-gpud.conf || true
    host systemctl enable "$UNIT" >/dev/null 2>&1 || die "systemctl enable $UNIT failed on the host"
    # The binary links the host's glibc: say so plainly when it is too old.
    if ! out=$(host /usr/bin/amd-gpud --version 2>&1); then
        die "/usr/bin/amd-gpud does not run on this host: $out"
    fi
    if systemd_running; then
        if [ "$changed" = 1 ]; then
            host systemctl reload dbus.service || log "could not reload the system bus: run 'systemctl reload dbus' on the host"
            host systemctl daemon-reload
            host systemctl restart "$UNIT" || die "$UNIT did not start: see 'journalctl -u amd-gpud' on the host"
        else
            host systemctl start "$UNIT" || die "$UNIT did not start: see 'journalctl -u amd-gpud' on the host"
        fi
    fi
    log "$out installed and enabled ($([ "$changed" = 1 ] && echo updated || echo unchanged))"
}

uninstall_files() {
    if package_owned; then
        log "the amd-gpud package is installed on this host (dpkg); leaving it to the package"
        return 0
    fi
    if systemd_running; then host systemctl stop "$UNIT" || true; fi
    host systemctl disable "$UNIT" >/dev/null 2>&1 || true
    for f in $(files); do
        rm -f "$HOST_ROOT/$f" "$HOST_ROOT/$f.amd-gpud-new"
    done
    # The CDI spec amd-gpud wrote, and the directories the package's tmpfiles entry made
    # when nothing else is in them (as packaging/deb/postrm does on purge).
    rm -f "$HOST_ROOT/run/cdi/amd.com-gpu.json"
    rm -f "$HOST_ROOT/etc/systemd/system/multi-user.target.wants/$UNIT"
    # The one directory of the package's own; the others (sysusers.d, dbus-1/system.d, ...)
    # are the system's and stay, as dpkg leaves them.
    rmdir "$HOST_ROOT/usr/share/doc/amd-gpud" 2>/dev/null || true
    rmdir "$HOST_ROOT/etc/cdi" "$HOST_ROOT/run/cdi" 2>/dev/null || true
    if systemd_running; then
        host systemctl daemon-reload || true
        host systemctl reload dbus.service || true
    fi
    log "amd-gpud removed"
}

case ${1:-} in
install) install_files ;;
uninstall) uninstall_files ;;
run)
    install_files
    trap 'exit 0' TERM INT
    while :; do
        sleep 3600 &
        wait $! || true
    done
    ;;
prestop)
    # A node that shuts down stops its pods too: keep amd-gpud installed for the next boot.
    # kubelet's graceful node shutdown stops pods while logind delays the shutdown (an
    # inhibitor lock), before systemd itself is "stopping": ask logind as well.
    if systemd_running; then
        state=$(host systemctl is-system-running 2>/dev/null || true)
        preparing=$(host busctl get-property org.freedesktop.login1 /org/freedesktop/login1 \
            org.freedesktop.login1.Manager PreparingForShutdown 2>/dev/null || true)
        if [ "$state" = stopping ] || [ "$preparing" = "b true" ]; then
            log "the host is shutting down: amd-gpud stays installed"
            exit 0
        fi
    fi
    uninstall_files
    ;;
*) die "unknown command '${1:-}': want install, uninstall, run or prestop" ;;
esac
