#!/usr/bin/env bash
# Build the binaries the installer puts on a host (plexus, plexus-daemon, sriov, plexus-shim) in
# release mode so that they run on glibc 2.28 and later (RHEL 8 and 9, Debian 10+, Ubuntu 20.04+),
# and copy them to <target>/host-release/, which is printed on stdout (the last line).
# - plexus, plexus-daemon, sriov: linked by zig (cargo-zigbuild) against glibc 2.28's symbol
#   versions, dynamically: name resolution (the API server's host name) goes through the host's
#   own glibc and NSS, as with any distribution binary.
# - plexus-shim: std only, no name resolution (a Unix socket), linked statically with the host's
#   gcc and glibc as deploy/Dockerfile always did (zig cannot link glibc statically): no loader.
# Installs the pinned tools when missing: cargo-zigbuild (cargo install, ~/.cargo/bin) and zig
# (the ziglang package from PyPI, under ~/.cache/plexus; python3-pip from apt when there is no
# pip). Needs crates.io, PyPI and Debian's mirror only. The normal target/debug and
# target/release builds are untouched: everything is built for the explicit target triple, in
# <target>/x86_64-unknown-linux-gnu/release/.
set -euo pipefail
cd "$(dirname "$0")/.."
ZIGLANG_VERSION=0.16.0
CARGO_ZIGBUILD_VERSION=0.24.1
GLIBC_FLOOR=2.28
triple=x86_64-unknown-linux-gnu
target_dir=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
out=$target_dir/host-release
log() { echo "release-build: $*" >&2; }

if [ "$(uname -m)" != x86_64 ]; then
	log "only x86_64 hosts are supported (aarch64 is not yet)"
	exit 1
fi

# zig, from the ziglang wheel, installed with --target (outside Debian's externally managed
# system Python, and without a virtualenv).
zig_home=${XDG_CACHE_HOME:-$HOME/.cache}/plexus/ziglang-$ZIGLANG_VERSION
zig=$zig_home/ziglang/zig
if [ ! -x "$zig" ] || [ "$("$zig" version 2>/dev/null)" != "$ZIGLANG_VERSION" ]; then
	if ! python3 -m pip --version >/dev/null 2>&1; then
		log "installing python3-pip (for the ziglang package)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq python3-pip >/dev/null
	fi
	log "installing zig $ZIGLANG_VERSION (PyPI ziglang) into $zig_home"
	rm -rf "$zig_home"
	python3 -m pip install --quiet --no-input --disable-pip-version-check --root-user-action=ignore --no-deps \
		--target "$zig_home" "ziglang==$ZIGLANG_VERSION" >&2
fi
export CARGO_ZIGBUILD_ZIG_PATH=$zig
# build-support/build_info.rs: no packed relocations below glibc 2.36; the commit and date that
# `--version` prints (from git when the caller did not set them, e.g. the Dockerfile's build args).
export PLEXUS_GLIBC_FLOOR=$GLIBC_FLOOR
if [ -z "${PLEXUS_BUILD_COMMIT:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
	PLEXUS_BUILD_COMMIT=$(git rev-parse --short=12 HEAD)
	git diff --quiet HEAD -- 2>/dev/null || PLEXUS_BUILD_COMMIT=$PLEXUS_BUILD_COMMIT-dirty
	PLEXUS_BUILD_DATE=${PLEXUS_BUILD_DATE:-$(git log -1 --format=%cd --date=format:%Y-%m-%d)}
fi
export PLEXUS_BUILD_COMMIT=${PLEXUS_BUILD_COMMIT:-} PLEXUS_BUILD_DATE=${PLEXUS_BUILD_DATE:-}

if [ "$(cargo-zigbuild --version 2>/dev/null)" != "cargo-zigbuild $CARGO_ZIGBUILD_VERSION" ]; then
	log "installing cargo-zigbuild $CARGO_ZIGBUILD_VERSION"
	cargo install --quiet --locked "cargo-zigbuild@$CARGO_ZIGBUILD_VERSION" >&2
fi

# The `.2.28` suffix makes zig link against glibc 2.28's symbol versions; the output still goes
# to <target>/x86_64-unknown-linux-gnu/release/.
log "building plexus, plexus-daemon, sriov for $triple.$GLIBC_FLOOR"
cargo zigbuild --release --locked --quiet --target-dir "$target_dir" \
	--target "$triple.$GLIBC_FLOOR" -p plexus-meta -p plexus-sriov --bins >&2
# The shim: static, with the host's gcc (the RUSTFLAGS apply to this one package only: it has
# no dependencies and no build script).
log "building plexus-shim (static)"
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
	cargo build --release --locked --quiet --target-dir "$target_dir" \
	--target "$triple" -p plexus-shim --bins >&2

rm -rf "$out"
mkdir -p "$out"
for b in plexus plexus-daemon sriov plexus-shim; do
	cp "$target_dir/$triple/release/$b" "$out/$b"
done
echo "$out"
