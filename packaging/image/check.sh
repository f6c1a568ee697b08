#!/usr/bin/env bash
# CI: inspects the images packaging/image/build.sh made (the OCI layouts and oci-archives under
# target/packaging): the plugin image's config (user 60700:60700, entrypoint the binary, no
# command, the OCI annotations), its root (exactly the expected files, no shell anywhere), its
# size next to the floor (the bare binary), and that the unpacked root runs
# `amd-device-plugin --version` as UID 60700. Then the node installer's image: root, a static
# shell, the package's files, and that its shell runs.
#   packaging/image/check.sh [PACKAGE.deb]   (the package the installer image must carry)
# Needs root (umoci unpack keeps the files' owners; chroot).
set -euo pipefail
# shellcheck source=packaging/common.sh
. "$(dirname "$0")/../common.sh"

version=$(workspace_version)
deb=${1:-}
[ -z "$deb" ] || [ -f "$deb" ] || die "PACKAGE.deb '$deb' is not a file"
[ "$(id -u)" = 0 ] || die "needs root (umoci unpack, chroot), running as UID $(id -u)"
need umoci:umoci skopeo:skopeo python3:python3

work=$(mktemp -d /var/tmp/amd-image-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "  ok    $*"; }
bad() {
    echo "  FAIL  $*" >&2
    fail=1
}

# json FILE PYTHON-EXPRESSION (of j, the parsed file): prints the value as JSON.
json() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps(eval(sys.argv[2])))' "$1" "$2"; }

# Checks common to both images; unpacks NAME's root into $work/NAME/rootfs.
check_common() {
    local name=$1 want_user=$2 want_entry=$3
    local layout=$OUT/oci/$name archive=$OUT/${name}_$version.oci.tar
    echo "== $name:$version"
    [ -d "$layout" ] || die "no OCI layout '$layout': run packaging/image/build.sh first"
    [ -f "$archive" ] || die "no oci-archive '$archive': run packaging/image/build.sh first"
    skopeo inspect --config "oci:$layout:$version" >"$work/$name.config.json"
    skopeo inspect --raw "oci:$layout:$version" >"$work/$name.manifest.json"
    local d1 d2
    d1=$(skopeo inspect --format '{{.Digest}}' "oci:$layout:$version")
    d2=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive:$version")
    if [ "$d1" = "$d2" ]; then ok "oci-archive holds the layout's manifest ($d1)"; else bad "digests differ: layout $d1, archive $d2"; fi
    local user entry cmd
    user=$(json "$work/$name.config.json" 'j["config"].get("User")')
    entry=$(json "$work/$name.config.json" 'j["config"].get("Entrypoint")')
    cmd=$(json "$work/$name.config.json" 'j["config"].get("Cmd")')
    if [ "$user" = "\"$want_user\"" ]; then ok "config user $user"; else bad "config user $user, want \"$want_user\""; fi
    if [ "$entry" = "$want_entry" ]; then ok "entrypoint $entry"; else bad "entrypoint $entry, want $want_entry"; fi
    if [ "$cmd" = null ] || [ "$cmd" = "[]" ]; then ok "no command in the config"; else bad "config has a command $cmd"; fi
    local key want have
    for pair in "org.opencontainers.image.version=$version" "org.opencontainers.image.source=$PROJECT_SOURCE" \
        "org.opencontainers.image.licenses=Apache-2.0" "org.opencontainers.image.title=" \
        "org.opencontainers.image.description=" "org.opencontainers.image.revision="; do
        key=${pair%%=*}
        want=${pair#*=}
        have=$(json "$work/$name.manifest.json" "j.get('annotations', {}).get('$key', '')")
        label=$(json "$work/$name.config.json" "(j['config'].get('Labels') or {}).get('$key', '')")
        if [ "$have" = "\"\"" ] || { [ -n "$want" ] && [ "$have" != "\"$want\"" ]; } || [ "$have" != "$label" ]; then
            bad "annotation $key: manifest $have, label $label${want:+, want \"$want\"}"
        else
            ok "annotation and label $key=$have"
        fi
    done
    mkdir -p "$work/$name"
    umoci unpack --image "$layout:$version" "$work/$name/bundle" >/dev/null
    ln -s bundle/rootfs "$work/$name/rootfs"
}

# ---- the plugin
name=$PLUGIN_IMAGE_NAME
check_common "$name" "$PLUGIN_UID:$PLUGIN_UID" '["/usr/bin/amd-device-plugin"]'
rootfs=$work/$name/rootfs/
have=$(cd "$rootfs" && find . -mindepth 1 ! -type d | sort | tr '\n' ' ')
want="./etc/group ./etc/passwd ./etc/ssl/certs/ca-certificates.crt ./usr/bin/amd-device-plugin "
if [ "$have" = "$want" ]; then ok "root holds exactly: $want"; else bad "root holds '$have', want '$want'"; fi
shells=$(cd "$rootfs" && find . \( -name sh -o -name bash -o -name dash -o -name ash -o -name busybox \) | tr '\n' ' ')
if [ -z "$shells" ] && [ ! -e "$rootfs/bin/sh" ]; then ok "no shell (/bin/sh, bash, dash, busybox)"; else bad "a shell in the root: $shells"; fi
pw=$(grep "^$PLUGIN_USER:" "$rootfs/etc/passwd" | cut -d: -f3,4 || true)
gr=$(grep "^$PLUGIN_USER:" "$rootfs/etc/group" | cut -d: -f3 || true)
if [ "$pw" = "$PLUGIN_UID:$PLUGIN_UID" ] && [ "$gr" = "$PLUGIN_UID" ]; then ok "/etc/passwd and /etc/group: $PLUGIN_USER $PLUGIN_UID:$PLUGIN_UID"; else bad "$PLUGIN_USER is '$pw' / '$gr', want $PLUGIN_UID"; fi
if out=$(chroot --userspec="$PLUGIN_UID:$PLUGIN_UID" "$rootfs" /usr/bin/amd-device-plugin --version 2>&1) &&
    [ "$out" = "amd-device-plugin $version" ]; then
    ok "the unpacked root runs '$out' as $PLUGIN_UID:$PLUGIN_UID"
else
    bad "amd-device-plugin --version as $PLUGIN_UID in the root: '$out', want 'amd-device-plugin $version'"
fi
# Size: the registry's figure (the compressed layer and the config, which a pull fetches), the
# unpacked root, and the floor: the bare binary.
compressed=$(json "$work/$name.manifest.json" 'sum(l["size"] for l in j["layers"]) + j["config"]["size"]')
unpacked=$(du -sb --apparent-size "$rootfs" | cut -f1)
binary=$(stat -c %s "$rootfs/usr/bin/amd-device-plugin")
archive_size=$(stat -c %s "$OUT/${name}_$version.oci.tar")
binary_gz=$(gzip -6 -c "$rootfs/usr/bin/amd-device-plugin" | wc -c)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "  size  pulled (compressed layer + config): $(mib "$compressed") ($compressed B)," \
    "floor: the gzipped binary $(mib "$binary_gz") ($binary_gz B), ratio $(ratio "$compressed" "$binary_gz")"
echo "  size  unpacked root: $(mib "$unpacked") ($unpacked B), floor: the bare binary" \
    "$(mib "$binary") ($binary B), ratio $(ratio "$unpacked" "$binary"); oci-archive $(mib "$archive_size")"

# ---- the node installer
name=$INSTALLER_IMAGE_NAME
if [ -d "$OUT/oci/$name" ]; then
    check_common "$name" 0:0 '["/bin/sh", "/usr/share/amd-gpud-node-installer/node-installer.sh"]'
    rootfs=$work/$name/rootfs/
    if file -b "$rootfs/bin/busybox" | grep -qE 'statically linked|static-pie'; then ok "/bin/busybox is static"; else bad "/bin/busybox is not static"; fi
    if out=$(chroot "$rootfs" /bin/sh -c 'echo sh-ok') && [ "$out" = sh-ok ]; then
        ok "its /bin/sh runs"
    else
        bad "/bin/sh in the installer's root: '$out'"
    fi
    if [ -n "$deb" ]; then
        mkdir -p "$work/deb"
        dpkg-deb -x "$deb" "$work/deb"
        if out=$(diff -r --no-dereference "$work/deb" "$rootfs/usr/share/amd-gpud-node-installer/root" 2>&1); then
            ok "carries exactly the files of $(basename "$deb")"
        else
            bad "its package files differ from $(basename "$deb"): $out"
        fi
    fi
    if cmp -s "$rootfs/usr/share/amd-gpud-node-installer/node-installer.sh" "$ROOT/packaging/node-installer/node-installer.sh"; then
        ok "carries node-installer.sh"
    else
        bad "node-installer.sh differs from packaging/node-installer/node-installer.sh"
    fi
    echo "  size  pulled $(mib "$(json "$work/$name.manifest.json" 'sum(l["size"] for l in j["layers"]) + j["config"]["size"]')")"
    # Kept for packaging/deb/check.sh, which runs the installer against a bookworm root.
    if [ -n "${INSTALLER_ROOTFS_OUT:-}" ]; then
        rm -rf "$INSTALLER_ROOTFS_OUT"
        cp -a "$work/$name/bundle/rootfs" "$INSTALLER_ROOTFS_OUT"
    fi
fi

[ "$fail" = 0 ] || die "the image check failed (see FAIL above)"
echo "image check: ok"
