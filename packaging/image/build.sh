#!/usr/bin/env bash
# Builds the project's two OCI images without a container engine, with umoci and skopeo
# (Debian packages):
#   amd-device-plugin-rs      FROM scratch: the static amd-device-plugin, CA certificates,
#                             /etc/passwd and /etc/group with amdgpu-plugin (60700); no shell.
#                             User 60700:60700, entrypoint the binary.
#   amd-gpud-node-installer   FROM scratch: a static busybox, the files of the amd-gpud Debian
#                             package and packaging/node-installer/node-installer.sh, for the
#                             chart's nodeInstaller (it needs a shell, the plugin image has none).
# Each as an OCI layout, target/packaging/oci/<name> (tag = the crate version = the chart's
# appVersion), and as an oci-archive, target/packaging/<name>_<version>.oci.tar, e.g.
#   skopeo copy oci-archive:target/packaging/amd-device-plugin-rs_0.1.0.oci.tar \
#       docker://ghcr.io/hami-amd/amd-device-plugin-rs:0.1.0
# Containerfile next to this file builds the plugin image from the same binary with an engine.
#
#   packaging/image/build.sh [PACKAGE.deb]
#   packaging/image/build.sh --build-plugin      only build the static binary, print its path
# PLUGIN_BIN=path uses a static amd-device-plugin built elsewhere; otherwise it is built with
# `cargo build --release -p plugin --target x86_64-unknown-linux-gnu` (the profile is
# $PACKAGING_PROFILE, see common.sh) and crt-static (glibc's
# libc.a; the musl target cannot be downloaded here), in a target dir of its own,
# <target>/static: RUSTFLAGS differ from the gpud build's anyway, and cargo locks a target dir,
# so the two release builds (each ending in a long single-threaded fat-LTO link) can run at
# once. Without PACKAGE.deb only the plugin image is built.
set -euo pipefail
# shellcheck source=packaging/common.sh
. "$(dirname "$0")/../common.sh"

version=$(workspace_version)

build_plugin() {
    local target_dir=$CARGO_TARGET/static
    # No debug info: the image's copy is stripped of it anyway (below), and the fat-LTO link
    # is faster without it.
    (cd "$ROOT" && CARGO_TARGET_DIR=$target_dir RUSTFLAGS='-C target-feature=+crt-static' \
        CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_CI_PACKAGE_DEBUG=false \
        cargo build --profile "$PACKAGING_PROFILE" -p plugin --target x86_64-unknown-linux-gnu \
        --locked) >&2
    echo "$target_dir/x86_64-unknown-linux-gnu/$(profile_dir)/amd-device-plugin"
}
if [ "${1:-}" = --build-plugin ]; then
    build_plugin
    exit 0
fi
deb=${1:-}
[ -z "$deb" ] || [ -f "$deb" ] || die "PACKAGE.deb '$deb' is not a file"
need umoci:umoci skopeo:skopeo file:file strip:binutils
[ -s /etc/ssl/certs/ca-certificates.crt ] || need update-ca-certificates:ca-certificates
[ -s /etc/ssl/certs/ca-certificates.crt ] || die "no /etc/ssl/certs/ca-certificates.crt after installing ca-certificates"

epoch=$(source_date_epoch)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)

# Fails unless FILE is a statically linked executable.
assert_static() {
    local what
    what=$(file -b "$1")
    case $what in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) die "'$1' is not statically linked: $what" ;;
    esac
    # ldd says "statically linked" (static-pie) or "not a dynamic executable", else it lists libraries.
    what=$(ldd "$1" 2>&1 || true)
    case $what in
    *"statically linked"* | *"not a dynamic executable"*) ;;
    *) die "'$1': ldd lists shared libraries: $what" ;;
    esac
}

# build_image NAME ROOTFS USER TITLE DESCRIPTION ENTRYPOINT...
# Packs ROOTFS (a directory) as the single layer of image NAME:version.
build_image() {
    local name=$1 rootfs=$2 user=$3 title=$4 description=$5
    shift 5
    local layout=$OUT/oci/$name image bundle archive
    image=$layout:$version
    bundle=$OUT/image/$name.bundle
    archive=$OUT/${name}_$version.oci.tar
    rm -rf "$layout" "$bundle" "$archive"
    mkdir -p "$OUT/oci"
    # Every timestamp from the last commit: a rebuild of one commit gives the same digests.
    find "$rootfs" -exec touch -h -d "@$epoch" {} +
    umoci init --layout "$layout"
    umoci new --image "$image"
    umoci config --image "$image" --no-history --created "$created" --os linux --architecture amd64
    umoci unpack --image "$image" "$bundle" >/dev/null
    cp -a "$rootfs/." "$bundle/rootfs/"
    touch -h -d "@$epoch" "$bundle/rootfs"
    umoci repack --image "$image" --history.created "$created" \
        --history.created_by "packaging/image/build.sh" \
        --history.comment "$title $version" "$bundle"
    local labels=() key value
    for pair in \
        "org.opencontainers.image.title=$title" \
        "org.opencontainers.image.description=$description" \
        "org.opencontainers.image.version=$version" \
        "org.opencontainers.image.revision=$revision" \
        "org.opencontainers.image.created=$created" \
        "org.opencontainers.image.source=$PROJECT_SOURCE" \
        "org.opencontainers.image.url=$PROJECT_SOURCE" \
        "org.opencontainers.image.licenses=Apache-2.0" \
        "org.opencontainers.image.vendor=amd-device-plugin-rs"; do
        key=${pair%%=*}
        value=${pair#*=}
        # OCI annotations on the manifest (image-spec annotations.md) and the same as config
        # labels, which `docker inspect` and registries' UIs show.
        labels+=(--manifest.annotation "$key=$value" --config.label "$key=$value")
    done
    local entry=()
    for word in "$@"; do entry+=(--config.entrypoint "$word"); done
    umoci config --image "$image" --no-history --created "$created" \
        --config.user "$user" --config.workingdir / "${entry[@]}" "${labels[@]}" \
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    umoci gc --layout "$layout"
    rm -rf "$bundle"
    skopeo copy --quiet "oci:$image" "oci-archive:$archive:$version"
    echo "$name: $layout ($version), $archive"
}

# ---- amd-device-plugin-rs
bin=${PLUGIN_BIN:-}
[ -n "$bin" ] || bin=$(build_plugin)
[ -x "$bin" ] || die "PLUGIN_BIN '$bin' is not an executable file"
assert_static "$bin"

rootfs=$OUT/image/plugin-rootfs
rm -rf "$rootfs"
install -d -m 0755 "$rootfs/usr/bin"
# Without the debug info (line tables, 4x the code), with the symbols: a panic's backtrace
# still names the functions.
strip --strip-debug -o "$rootfs/usr/bin/amd-device-plugin" "$bin"
chmod 0755 "$rootfs/usr/bin/amd-device-plugin"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# The same user and group as systemd/amd-gpud.sysusers.conf, so that the UID has a name in
# the container too; root only as the owner of the files. No shell exists to log in to.
printf 'root:x:0:0:root:/:/sbin/nologin\n%s:x:%s:%s:AMD GPU device plugin (amd-gpud client):/:/sbin/nologin\n' \
    "$PLUGIN_USER" "$PLUGIN_UID" "$PLUGIN_UID" >"$rootfs/etc/passwd"
printf 'root:x:0:\n%s:x:%s:\n' "$PLUGIN_USER" "$PLUGIN_UID" >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
build_image "$PLUGIN_IMAGE_NAME" "$rootfs" "$PLUGIN_UID:$PLUGIN_UID" amd-device-plugin \
    "amd-device-plugin: the unprivileged kubelet device plugin for AMD GPUs under HAMi" \
    /usr/bin/amd-device-plugin

# ---- amd-gpud-node-installer
[ -n "$deb" ] || exit 0
need dpkg-deb:dpkg
busybox=/bin/busybox
if ! { [ -x "$busybox" ] && file -b "$busybox" | grep -q 'statically linked'; }; then
    need busybox:busybox-static
fi
assert_static "$busybox"
rootfs=$OUT/image/installer-rootfs
share=$rootfs/usr/share/amd-gpud-node-installer
rm -rf "$rootfs"
install -D -m 0755 "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
done
mkdir -p "$share/root"
dpkg-deb -x "$deb" "$share/root"
install -m 0755 "$ROOT/packaging/node-installer/node-installer.sh" "$share/node-installer.sh"
build_image "$INSTALLER_IMAGE_NAME" "$rootfs" 0:0 amd-gpud-node-installer \
    "Installs amd-gpud (the files of its Debian package) on a Kubernetes node from a privileged pod" \
    /bin/sh /usr/share/amd-gpud-node-installer/node-installer.sh
