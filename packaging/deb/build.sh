#!/usr/bin/env bash
# Builds the Debian package of amd-gpud with dpkg-deb from our own control file:
#   target/packaging/amd-gpud_<version>_amd64.deb
# The files go where systemd/README.md says; the maintainer scripts next to this file create
# the user before the bus re-reads its policy, and enable/start the unit where systemd runs.
# GPUD_BIN=path uses an amd-gpud built elsewhere (its amd-gpud-loader-check beside it);
# otherwise `cargo build --release -p gpud --bins`
# (--profile $PACKAGING_PROFILE when that is set, see common.sh).
set -euo pipefail
# shellcheck source=packaging/common.sh
. "$(dirname "$0")/../common.sh"

version=$(workspace_version)
need dpkg-deb:dpkg objdump:binutils

bin=${GPUD_BIN:-}
if [ -z "$bin" ]; then
    (cd "$ROOT" && cargo build --profile "$PACKAGING_PROFILE" -p gpud --bins --locked)
    bin=$CARGO_TARGET/$(profile_dir)/amd-gpud
fi
[ -x "$bin" ] || die "GPUD_BIN '$bin' is not an executable file"
# The loader check's helper (containerd client and image parsers), built with amd-gpud.
helper=$(dirname "$bin")/amd-gpud-loader-check
[ -x "$helper" ] || die "'$helper' is not an executable file: it is built with amd-gpud (cargo build -p gpud --bins)"

# The oldest glibc the binaries run on: the newest GLIBC_x.y symbol version they reference.
libc_min=$(objdump -T "$bin" "$helper" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
[ -n "$libc_min" ] || die "no GLIBC_ symbol versions in '$bin': is it a glibc binary?"

stage=$OUT/deb/amd-gpud_${version}_amd64
rm -rf "$stage"
s=$ROOT/systemd
install -d -m 0755 "$stage/usr/bin"
# As dh_strip would, but keeping the symbols: a panic's backtrace still names the functions.
strip --strip-debug -o "$stage/usr/bin/amd-gpud" "$bin"
strip --strip-debug -o "$stage/usr/bin/amd-gpud-loader-check" "$helper"
chmod 0755 "$stage/usr/bin/amd-gpud" "$stage/usr/bin/amd-gpud-loader-check"
install -D -m 0644 "$s/amd-gpud.service" "$stage/usr/lib/systemd/system/amd-gpud.service"
install -D -m 0644 "$s/io.hami.AmdGpu1.conf" "$stage/usr/share/dbus-1/system.d/io.hami.AmdGpu1.conf"
install -D -m 0644 "$s/amd-gpud.sysusers.conf" "$stage/usr/lib/sysusers.d/amd-gpud.conf"
install -D -m 0644 "$s/amd-gpud.tmpfiles.conf" "$stage/usr/lib/tmpfiles.d/amd-gpud.conf"
install -D -m 0755 "$s/amd-gpud-sysfs-generator" \
    "$stage/usr/lib/systemd/system-generators/amd-gpud-sysfs-generator"
install -d -m 0755 "$stage/usr/share/doc/amd-gpud"
cat >"$stage/usr/share/doc/amd-gpud/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: amd-gpud
Source: $PROJECT_SOURCE

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
COPYRIGHT

install -d -m 0755 "$stage/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$ROOT/packaging/deb/$script" "$stage/DEBIAN/$script"
done
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@MAINTAINER@|$DEB_MAINTAINER|" \
    -e "s|@INSTALLED_SIZE@|$installed_kib|" -e "s|@LIBC_MIN@|$libc_min|" \
    -e "s|@HOMEPAGE@|$PROJECT_SOURCE|" "$ROOT/packaging/deb/control.in" >"$stage/DEBIAN/control"
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"

deb=$OUT/amd-gpud_${version}_amd64.deb
# SOURCE_DATE_EPOCH: dpkg-deb stamps the archive members with it (reproducible builds).
SOURCE_DATE_EPOCH=$(source_date_epoch) dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,/Description:/p' >&2
