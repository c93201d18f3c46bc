#!/usr/bin/env bash
# Install what building and running plexus needs on Debian 12 (run as root).
set -euo pipefail
# etcd-server, util-linux (setpriv), xz-utils: the real-cluster tiers (kubectl v1.36.2 comes with the
# Kubernetes binaries in PLEXUS_K8S_BIN, ../shared/k8s/bin: never one from PATH).
# containerd, runc, iptables (portmap), libc6-dev (gcc -static: the pause image): the node tier.
# iputils-ping: traffic checks across the interfaces plexus makes.
packages=(containernetworking-plugins iproute2 jq curl ca-certificates gcc pkg-config etcd-server util-linux xz-utils
  containerd runc iptables libc6-dev iputils-ping conmon skopeo libsqlite3-0 # conmon..: the CRI-O tier
  python3-pip # the ziglang package (scripts/release-build.sh: binaries for glibc 2.28)
  mmdebstrap) # scripts/build-image.sh: the installer image the node tiers and image_build run
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    # Debian 12's rustc is too old for this workspace: use rustup (toolchain pinned in rust-toolchain.toml).
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
# Debian's Prometheus 2.42 and promtool, for the test run only (scripts/test.sh sets
# PLEXUS_SETUP_TESTS=1): the alert rules are checked with promtool, and the metrics tier
# scrapes a real node with a real Prometheus it starts itself. Without the recommended node exporter; the packaged service is
# stopped and disabled where systemd started it, so nothing keeps running on the host.
if [ "${PLEXUS_SETUP_TESTS:-0}" = 1 ] && ! command -v promtool >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
# The SR-IOV VM tier (QEMU with an emulated igb NIC, Debian's kernel in target/vm): only for the
# test run (scripts/test.sh sets PLEXUS_SETUP_VM=1), not for the demo. PLEXUS_VM_TIER=skip opts out.
if [ "${PLEXUS_SETUP_VM:-0}" = 1 ] && [ "${PLEXUS_VM_TIER:-}" != skip ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/vm-setup.sh"
fi
