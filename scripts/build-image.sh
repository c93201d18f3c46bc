#!/bin/bash
# Build the plexus installer image (what deploy/Dockerfile describes) from this repo with
# Debian's own tools: no Docker engine, no base image from a registry. Writes an OCI image
# layout as a tar archive (`ctr -n k8s.io images import FILE`, `skopeo copy oci-archive:FILE …`)
# and an SBOM-ish listing beside it (FILE.sbom.txt). See docs/image.md.
#
# Layers:
#   1. a minimal Debian 12 root made by `mmdebstrap --variant=extract`: exactly the packages
#      deploy/install.sh and the binaries need (BASE_PACKAGES and their dependencies), without
#      docs (copyright files kept), man pages, locales, gconv, apt or dpkg's own files; a
#      /var/lib/dpkg/status listing the extracted packages (for SBOM scanners);
#   2. plexus: /install.sh and /usr/src/plexus/bin/{plexus,plexus-daemon,plexus-shim,sriov}.
#
# Reproducible: every tar entry sorted by name, mtime SOURCE_DATE_EPOCH (default: the commit
# time of HEAD), no atime/ctime, gzip without name or time. The same binaries, install.sh,
# SOURCE_DATE_EPOCH, revision and Debian package versions give the same digest; the mirror's
# package versions move with Debian's point releases and security updates (--mirror pins them
# to a snapshot).
set -euo pipefail
umask 022
export LC_ALL=C

REPO=$(cd "$(dirname "$0")/.." && pwd)
SELF=$REPO/scripts/build-image.sh

# What the image holds from Debian (plus their Depends, resolved by apt). Every command
# deploy/install.sh runs: sh (dash), coreutils (cp mv dd sha256sum cut base64 tr mkdir rm sleep
# cat date chmod head sort wc stat timeout), cmp (diffutils), grep, find (findutils), jq; libc6
# and libgcc-s1 for the dynamically linked binaries; base-files for the directory layout and
# /etc/os-release. e2e/tests/image_build.rs checks each program is there.
BASE_PACKAGES="base-files coreutils dash diffutils findutils grep jq libc6 libgcc-s1"
# The files of layer 2 (image path, source); tests/image_build.rs compares them with the
# Dockerfile's COPY lines.
BINARIES="plexus plexus-daemon plexus-shim sriov"
BIN_DEST=/usr/src/plexus/bin

usage() {
	cat <<'EOF'
usage: scripts/build-image.sh [options]
  --bin-dir DIR       the four binaries (plexus, plexus-daemon, plexus-shim, sriov) to put in
                      the image [default: the directory scripts/release-build.sh prints, or
                      `cargo build --release --locked` into target/release without it]
  --out FILE          the OCI archive   [target/image/plexus-<version>.oci.tar]
  --name REF          the image reference [docker.io/library/plexus:<workspace version>]
  --install-sh FILE   the installer     [deploy/install.sh]
  --strip             strip the binaries (debug builds; a release build is stripped already)
  --cache-dir DIR     keep the Debian layer here, keyed by packages, suite, mirror and
                      SOURCE_DATE_EPOCH [target/image/cache]; --no-cache: build it afresh
  --suite SUITE       [bookworm]
  --mirror URL        Debian mirror, e.g. a snapshot.debian.org URL to pin package versions
                      [http://deb.debian.org/debian]
  --sbom FILE         [<out>.sbom.txt]
Environment: SOURCE_DATE_EPOCH (default: `git log -1 --format=%ct`).
Prints the archive's path and the manifest digest on stdout.
EOF
}

log() { printf 'build-image: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# ------------------------------------------------------------------------------------- the hook

# mmdebstrap's extract hook (runs on the host, $1 = the root, packages extracted, their .debs
# still in var/cache/apt/archives): write var/lib/dpkg/status from the .debs' control data.
if [ "${1:-}" = --extract-hook ]; then
	root=$2
	status=$root/var/lib/dpkg/status
	: >"$status"
	for deb in "$root"/var/cache/apt/archives/*.deb; do
		dpkg-deb -f "$deb" | awk 'NR == 1 { print; print "Status: install ok installed"; next } { print }' >>"$status"
		echo >>"$status"
	done
	exit 0
fi

# --------------------------------------------------------------------------------------- options

BIN_DIR=
OUT=
NAME=
INSTALL_SH=$REPO/deploy/install.sh
STRIP=false
CACHE_DIR=$REPO/target/image/cache
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SBOM=
while [ "$#" -gt 0 ]; do
	case $1 in
	--bin-dir) BIN_DIR=${2:?--bin-dir needs a value}; shift ;;
	--out) OUT=${2:?--out needs a value}; shift ;;
	--name) NAME=${2:?--name needs a value}; shift ;;
	--install-sh) INSTALL_SH=${2:?--install-sh needs a value}; shift ;;
	--strip) STRIP=true ;;
	--cache-dir) CACHE_DIR=${2:?--cache-dir needs a value}; shift ;;
	--no-cache) CACHE_DIR= ;;
	--suite) SUITE=${2:?--suite needs a value}; shift ;;
	--mirror) MIRROR=${2:?--mirror needs a value}; shift ;;
	--sbom) SBOM=${2:?--sbom needs a value}; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown option: $1" ;;
	esac
	shift
done

VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml")
[ -n "$VERSION" ] || die "no [workspace.package] version in Cargo.toml"
NAME=${NAME:-docker.io/library/plexus:$VERSION}
OUT=${OUT:-$REPO/target/image/plexus-$VERSION.oci.tar}
SBOM=${SBOM:-$OUT.sbom.txt}
REVISION=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
case $SOURCE_DATE_EPOCH in '' | *[!0-9]*) die "SOURCE_DATE_EPOCH must be whole seconds" ;; esac
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap extracts the Debian root with its owners)"

# --------------------------------------------------------------------------------------- tools

missing=
for t in mmdebstrap:mmdebstrap jq:jq dpkg-deb:dpkg gzip:gzip sha256sum:coreutils; do
	command -v "${t%%:*}" >/dev/null 2>&1 || missing="$missing ${t#*:}"
done
if [ "$STRIP" = true ]; then command -v strip >/dev/null 2>&1 || missing="$missing binutils"; fi
if [ -n "$missing" ]; then
	log "installing$missing (apt-get)"
	apt-get install -y -qq --no-install-recommends $missing >&2 ||
		{ apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends $missing >&2; } ||
		die "cannot install$missing"
fi
tar --version | head -n 1 | grep -q 'GNU tar' || die "GNU tar is needed"

# Deterministic tar: sorted entries (the list is sorted), fixed mtime, no atime/ctime,
# numeric owners.
det_tar() { # det_tar DIR LISTFILE OUTFILE [extra tar options]
	local dir=$1 list=$2 out=$3
	shift 3
	tar -C "$dir" --format=posix \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
		--mtime="@$SOURCE_DATE_EPOCH" --numeric-owner --no-recursion "$@" \
		-cf "$out" -T "$list"
}
sorted_entries() { # every path under DIR, relative, sorted bytewise
	(cd "$1" && find . -mindepth 1 | sed 's|^\./||' | sort)
}
sha() { sha256sum "$1" | cut -d' ' -f1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/plexus-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
T0=$(date +%s)

# --------------------------------------------------------------------------------- the binaries

if [ -z "$BIN_DIR" ]; then
	if [ -x "$REPO/scripts/release-build.sh" ]; then
		log "building the release binaries (scripts/release-build.sh)"
		# What `--version` prints (build-support/build_info.rs), unless the caller set it.
		BIN_DIR=$(PLEXUS_BUILD_COMMIT=${PLEXUS_BUILD_COMMIT:-$REVISION} \
			PLEXUS_BUILD_DATE=${PLEXUS_BUILD_DATE:-$CREATED} \
			"$REPO/scripts/release-build.sh" | tail -n 1)
	else
		log "building the release binaries (cargo build --release)"
		(cd "$REPO" && cargo build --release --locked -p plexus-meta -p plexus-sriov -p plexus-shim --bins >&2)
		BIN_DIR=$REPO/target/release
	fi
fi
for b in $BINARIES; do
	[ -f "$BIN_DIR/$b" ] || die "$BIN_DIR/$b not found (--bin-dir needs $BINARIES)"
done
[ -f "$INSTALL_SH" ] || die "$INSTALL_SH not found"

# ------------------------------------------------------------------------------ layer 1: Debian

# Stored as: layer.tar.gz, diff_id, packages.tsv (name version arch source).
base_layer() { # base_layer DEST_DIR
	local dest=$1 root=$WORK/root
	log "mmdebstrap $SUITE: $BASE_PACKAGES"
	# Merged /usr as in Debian 12 (the loader's path /lib64/ld-linux-x86-64.so.2 included).
	mmdebstrap --quiet --variant=extract --format=directory \
		--include="${BASE_PACKAGES// /,}" \
		--setup-hook='for d in bin sbin lib lib64; do mkdir -p "$1/usr/$d" && ln -s "usr/$d" "$1/$d"; done' \
		--extract-hook="\"$SELF\" --extract-hook \"\$1\"" \
		--skip=output/dev,output/mknod \
		"$SUITE" "$root" "$MIRROR" >&2 || die "mmdebstrap failed"
	# A container image: no docs but the licenses, no man pages, locales or gconv modules (the
	# image runs in the C locale), no apt or dpkg configuration, nothing host-specific.
	find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
	find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
	rm -rf "$root"/usr/share/{man,info,locale,lintian,linda} "$root"/usr/lib/x86_64-linux-gnu/gconv \
		"$root"/etc/apt "$root"/etc/hostname "$root"/etc/resolv.conf "$root"/var/cache/apt \
		"$root"/var/lib/apt "$root"/var/log/apt "$root"/var/cache/ldconfig "$root"/dev/*
	find "$root/var/lib/dpkg" -mindepth 1 ! -name status -exec rm -rf {} +
	# As in debian:12: /var/run and /var/lock into /run (CNI_NETNS paths are /var/run/netns/…).
	rm -rf "$root/var/run" "$root/var/lock"
	ln -s /run "$root/var/run"
	ln -s /run/lock "$root/var/lock"
	sorted_entries "$root" >"$WORK/base.list"
	det_tar "$root" "$WORK/base.list" "$WORK/base.tar"
	mkdir -p "$dest"
	sha "$WORK/base.tar" >"$dest/diff_id"
	gzip -n -6 <"$WORK/base.tar" >"$dest/layer.tar.gz"
	awk '/^Package:/ { p = $2 } /^Version:/ { v = $2 } /^Architecture:/ { a = $2 }
		/^Source:/ { s = $2 } /^$/ { if (p != "") print p "\t" v "\t" a "\t" (s == "" ? p : s); p = v = a = s = "" }' \
		"$root/var/lib/dpkg/status" | sort >"$dest/packages.tsv"
	rm -rf "$root" "$WORK/base.tar"
}

KEY=$(printf 'recipe 1\n%s\n%s\n%s\n%s\n%s\n' "$BASE_PACKAGES" "$SUITE" "$MIRROR" "$SOURCE_DATE_EPOCH" "$(sha "$SELF")" |
	sha256sum | cut -c1-16)
if [ -n "$CACHE_DIR" ] && [ -f "$CACHE_DIR/base-$KEY/layer.tar.gz" ]; then
	BASE=$CACHE_DIR/base-$KEY
	log "Debian layer from the cache ($BASE)"
elif [ -n "$CACHE_DIR" ]; then
	mkdir -p "$CACHE_DIR"
	base_layer "$WORK/base"
	# A concurrent build may have stored the same key: keep the first.
	mv -T "$WORK/base" "$CACHE_DIR/base-$KEY" 2>/dev/null || true
	BASE=$CACHE_DIR/base-$KEY
	# One entry per SOURCE_DATE_EPOCH (commit): keep the newest three.
	ls -dt "$CACHE_DIR"/base-* | tail -n +4 | while read -r old; do rm -rf "$old"; done
else
	base_layer "$WORK/base"
	BASE=$WORK/base
fi

# ------------------------------------------------------------------------------ layer 2: plexus

P=$WORK/plexus
mkdir -p "$P$BIN_DEST"
install -m 0755 "$INSTALL_SH" "$P/install.sh"
for b in $BINARIES; do
	if [ "$STRIP" = true ]; then
		strip -o "$P$BIN_DEST/$b" "$BIN_DIR/$b"
	else
		cp "$BIN_DIR/$b" "$P$BIN_DEST/$b"
	fi
	chmod 0755 "$P$BIN_DEST/$b"
done
chmod 0755 "$P/usr" "$P/usr/src" "$P/usr/src/plexus" "$P$BIN_DEST"
sorted_entries "$P" >"$WORK/plexus.list"
det_tar "$P" "$WORK/plexus.list" "$WORK/plexus.tar" --owner=0 --group=0
PLEXUS_DIFF=$(sha "$WORK/plexus.tar")
gzip -n -6 <"$WORK/plexus.tar" >"$WORK/plexus.tar.gz"

# ------------------------------------------------------------------------------ the OCI layout

L=$WORK/layout
mkdir -p "$L/blobs/sha256"
blob() { # blob FILE: store FILE as a blob; prints "digest size"
	local d
	d=$(sha "$1")
	cp "$1" "$L/blobs/sha256/$d"
	echo "sha256:$d $(stat -c %s "$1")"
}
read -r BASE_DIGEST BASE_SIZE < <(blob "$BASE/layer.tar.gz")
read -r PLEXUS_DIGEST PLEXUS_SIZE < <(blob "$WORK/plexus.tar.gz")

jq -cnS --arg created "$CREATED" --arg version "$VERSION" --arg revision "$REVISION" \
	--arg base "sha256:$(cat "$BASE/diff_id")" --arg plexus "sha256:$PLEXUS_DIFF" \
	--arg pkgs "$BASE_PACKAGES" --arg suite "$SUITE" '{
	architecture: "amd64", os: "linux", created: $created,
	config: {
		Entrypoint: ["/install.sh"],
		Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
		Labels: {
			"org.opencontainers.image.title": "plexus",
			"org.opencontainers.image.description": "Plexus node installer: CNI meta-plugin and SR-IOV delegate",
			"org.opencontainers.image.version": $version,
			"org.opencontainers.image.revision": $revision,
			"org.opencontainers.image.created": $created,
			"org.opencontainers.image.licenses": "Apache-2.0",
			"org.opencontainers.image.base.name": ("debian:" + $suite + " (mmdebstrap --variant=extract)")
		}
	},
	rootfs: {type: "layers", diff_ids: [$base, $plexus]},
	history: [
		{created: $created, created_by: ("mmdebstrap --variant=extract " + $suite + ": " + $pkgs)},
		{created: $created, created_by: "scripts/build-image.sh: /install.sh, /usr/src/plexus/bin/"}
	]}' >"$WORK/config.json"
read -r CONFIG_DIGEST CONFIG_SIZE < <(blob "$WORK/config.json")

jq -cnS --arg cd "$CONFIG_DIGEST" --argjson cs "$CONFIG_SIZE" \
	--arg bd "$BASE_DIGEST" --argjson bs "$BASE_SIZE" --arg pd "$PLEXUS_DIGEST" --argjson ps "$PLEXUS_SIZE" '{
	schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
	config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
	layers: [
		{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $bd, size: $bs},
		{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $pd, size: $ps}
	]}' >"$WORK/manifest.json"
read -r MANIFEST_DIGEST MANIFEST_SIZE < <(blob "$WORK/manifest.json")

# The full reference in both annotations: containerd's import reads io.containerd.image.name,
# skopeo and the CRI-O tier read org.opencontainers.image.ref.name.
jq -cnS --arg md "$MANIFEST_DIGEST" --argjson ms "$MANIFEST_SIZE" --arg name "$NAME" '{
	schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
	manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
		platform: {architecture: "amd64", os: "linux"},
		annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $name}}]
	}' >"$L/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$L/oci-layout"
chmod 0644 "$L/index.json" "$L/oci-layout" "$L"/blobs/sha256/*
chmod 0755 "$L/blobs" "$L/blobs/sha256"
sorted_entries "$L" >"$WORK/layout.list"
mkdir -p "$(dirname "$OUT")"
det_tar "$L" "$WORK/layout.list" "$WORK/out.tar" --owner=0 --group=0
mv -f "$WORK/out.tar" "$OUT"

# ------------------------------------------------------------------------------------- the SBOM

{
	echo "# plexus image SBOM (scripts/build-image.sh)"
	echo "image: $NAME"
	echo "manifest: $MANIFEST_DIGEST"
	echo "revision: $REVISION"
	echo "created: $CREATED"
	echo "layers: $BASE_DIGEST (Debian $SUITE) $PLEXUS_DIGEST (plexus)"
	echo
	echo "## Debian packages (name, version, architecture, source)"
	cat "$BASE/packages.tsv"
	echo
	echo "## plexus files"
	(cd "$P" && find . -type f | sed 's|^\.||' | sort | while read -r f; do
		printf '%s\t%s\n' "$f" "$(sha ".$f")"
	done)
	echo
	echo "## Rust crates linked into the binaries (name, version)"
	if ! (cd "$REPO" && cargo tree --locked --offline -q -e normal --prefix none \
		-p plexus-meta -p plexus-sriov -p plexus-shim 2>/dev/null) |
		sed -n 's/^\([A-Za-z0-9_-]*\) v\([^ ]*\).*/\1\t\2/p' | grep -v '^plexus' | sort -u | grep .; then
		echo "# (cargo tree unavailable: every package of Cargo.lock)"
		awk '/^name = / { n = $3 } /^version = / { v = $3; gsub(/"/, "", n); gsub(/"/, "", v); print n "\t" v }' \
			"$REPO/Cargo.lock" | sort -u
	fi
} >"$SBOM"

log "$OUT: $NAME, manifest $MANIFEST_DIGEST, $(stat -c %s "$OUT") bytes, $(($(date +%s) - T0)) s"
echo "$OUT"
echo "$MANIFEST_DIGEST"
