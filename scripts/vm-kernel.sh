#!/usr/bin/env bash
# Fetch Debian's kernel for the SR-IOV VM tier and unpack it (never installs it).
#
# Usage: scripts/vm-kernel.sh [DIR]      (DIR defaults to $PLEXUS_VM_DIR, else <target>/vm, the
#                                        target directory being $CARGO_TARGET_DIR or ./target)
#
# Takes the linux-image-*-amd64 package that Debian's `linux-image-amd64` points at (bookworm:
# 6.1, which has igb, igbvf, vfio-pci and the 9p modules), downloads it with `apt-get download`
# into DIR and unpacks it with `dpkg-deb -x` into DIR/linux-<version>. DIR/kernel is a symlink
# to the unpacked tree the VM tier boots. Idempotent: a present tree is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
case $target in /*) ;; *) target="$PWD/$target" ;; esac
dir="${1:-${PLEXUS_VM_DIR:-$target/vm}}"
mkdir -p "$dir"
cd "$dir"

if [ -e kernel/boot ] && ls kernel/boot/vmlinuz-* >/dev/null 2>&1; then
  echo "vm-kernel: using $(readlink -f kernel)"
  exit 0
fi

pkg_name() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
pkg="$(pkg_name || true)"
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg="$(pkg_name)"
fi
[ -n "$pkg" ] || { echo "vm-kernel: cannot resolve linux-image-amd64" >&2; exit 1; }

# apt's sandbox user cannot write into a root-owned build directory: download as root.
if ! ls "${pkg}"_*.deb >/dev/null 2>&1; then
  apt-get download -o APT::Sandbox::User=root "$pkg" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get download -o APT::Sandbox::User=root "$pkg" >/dev/null; }
fi
deb="$(ls "${pkg}"_*.deb | head -n1)"
ver="${pkg#linux-image-}"
tree="linux-$ver"
rm -rf "$tree.tmp"
mkdir "$tree.tmp"
dpkg-deb -x "$deb" "$tree.tmp"
rm -rf "$tree"
mv "$tree.tmp" "$tree"
ln -sfn "$tree" kernel
# The tree is all the tier needs; drop the package (70 MB).
rm -f "$deb"
echo "vm-kernel: unpacked $pkg into $dir/$tree"
