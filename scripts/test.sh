#!/usr/bin/env bash
# Run every check and test of the workspace (as root: the tests create network namespaces).
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: run as root (sudo $0 if you are not root)" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
# Also installs the SR-IOV VM tier's QEMU and kernel (PLEXUS_VM_TIER=skip to leave it out).
export PLEXUS_SETUP_VM=1
source scripts/setup.sh
export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every binary, built once up front (the e2e tests link their own copies through e2e-bin/; this
# build is what the demo and a manual run use, and it fails fast on a build error).
cargo build --workspace --bins --locked
cargo test --workspace --locked
