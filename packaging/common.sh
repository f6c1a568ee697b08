# Sourced by the packaging scripts (bash): the project's names and version, in one place.
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are for the scripts that source this file

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything built goes here (inside the clone's target dir, so `cargo clean` removes it).
OUT=${PACKAGING_OUT:-$ROOT/target/packaging}
# Cargo's target dir (CI keeps it outside the clone) and the profile the binaries are built
# with: `release` (fat LTO, what is published) unless PACKAGING_PROFILE names another
# (.ci/packaging uses `ci-package`, the same code without the LTO; Cargo.toml says why).
CARGO_TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PACKAGING_PROFILE=${PACKAGING_PROFILE:-release}
# The directory cargo puts a profile's binaries in (`dev` builds land in `debug`).
profile_dir() {
    case "$PACKAGING_PROFILE" in
        dev) echo debug ;;
        *) echo "$PACKAGING_PROFILE" ;;
    esac
}

# The project's own names. The chart's image.repository and nodeInstaller.image.repository
# default to these (helm/amd-gpu/values.yaml); the Go plugin's image
# (ghcr.io/project-hami/amd-device-plugin) is another program with other flags.
PROJECT_SOURCE=${PROJECT_SOURCE:-https://github.com/hami-amd/amd-device-plugin-rs}
IMAGE_REGISTRY=${IMAGE_REGISTRY:-ghcr.io/hami-amd}
PLUGIN_IMAGE_NAME=amd-device-plugin-rs
INSTALLER_IMAGE_NAME=amd-gpud-node-installer
DEB_MAINTAINER=${DEB_MAINTAINER:-amd-device-plugin-rs developers <amd-device-plugin-rs@users.noreply.github.com>}
# The plugin's system user (systemd/amd-gpud.sysusers.conf, the chart's runAsUser).
PLUGIN_USER=amdgpu-plugin
PLUGIN_UID=60700

die() {
    echo "error: $*" >&2
    exit 1
}

# The workspace version (Cargo.toml [workspace.package]), which is also the chart's
# appVersion: the image tag the chart pulls by default and the package's version.
workspace_version() {
    local version app
    version=$(awk '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 }
        p && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' "$ROOT/Cargo.toml")
    [ -n "$version" ] || die "no version in [workspace.package] of $ROOT/Cargo.toml"
    app=$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' "$ROOT/helm/amd-gpu/Chart.yaml")
    [ "$app" = "$version" ] ||
        die "helm/amd-gpu/Chart.yaml appVersion '$app' differs from the crate version '$version'"
    echo "$version"
}

# Timestamps of everything built: the last commit's, so that two builds of one commit match.
source_date_epoch() {
    if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
        echo "$SOURCE_DATE_EPOCH"
    else
        git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0
    fi
}

# Installs Debian packages that provide missing commands: need CMD:PACKAGE ...
need() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
    done
    if ((${#missing[@]})); then
        echo "installing ${missing[*]}" >&2
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
            { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } ||
            die "could not install ${missing[*]} with apt-get"
    fi
}

# Every Debian package the packaging scripts use, installed at once: .ci/packaging calls this
# before it starts its background jobs, so that no two apt-get runs race for dpkg's lock.
need_packaging_tools() {
    need shellcheck:shellcheck umoci:umoci skopeo:skopeo debootstrap:debootstrap \
        dpkg-deb:dpkg objdump:binutils strip:binutils file:file python3:python3 \
        systemd-analyze:systemd
    [ -s /etc/ssl/certs/ca-certificates.crt ] || need update-ca-certificates:ca-certificates
    # A static busybox for the node installer's image (Debian's busybox package is dynamic).
    if ! { [ -x /bin/busybox ] && file -b /bin/busybox | grep -qE 'statically linked|static-pie'; }; then
        need static-busybox-missing:busybox-static
    fi
}
