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
# Also installs what only the tests use (Prometheus and promtool for the metrics tiers).
export PLEXUS_SETUP_TESTS=1
source scripts/setup.sh
export CARGO_TERM_COLOR=never
# One full run builds every test binary once: incremental caches would only add gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The previous plexus build (e2e/previous-build) for the churn tier's roll-back and upgrade
# cases; first, since it shares target/ and the build below puts this tree's binaries back.
PLEXUS_PREV_BIN="${PLEXUS_PREV_BIN:-$(bash scripts/prev-build.sh)}"
export PLEXUS_PREV_BIN
# The host binaries as shipped (glibc >= 2.28, docs/compatibility.md "Host binaries"): checked by
# release_binaries, and carried by the installer image the node tiers run (scripts/build-image.sh).
PLEXUS_RELEASE_DIR="${PLEXUS_RELEASE_DIR:-$(bash scripts/release-build.sh | tail -n 1)}"
export PLEXUS_RELEASE_DIR
# Every binary, built once up front (the e2e tests link their own copies through e2e-bin/; this
# build is what the demo and a manual run use, and it fails fast on a build error).
cargo build --workspace --bins --locked
cargo test --workspace --locked --no-run
# The SR-IOV VM tier runs beside the others: everything it touches is inside QEMU (its apiserver
# on the host is its own, on free ports), and the host tiers mostly wait on kubelets, so the two
# together take about as long as the longer one. Its output is printed after the others'.
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
vm_log=$target_dir/vm-tier.log
cargo test --workspace --locked --test vm_sriov >"$vm_log" 2>&1 &
vm_pid=$!
trap 'kill "$vm_pid" 2>/dev/null || true' EXIT
rc=0
cargo test --workspace --locked --no-fail-fast -- --skip vm_sriov || rc=$?
vm_rc=0
wait "$vm_pid" || vm_rc=$?
trap - EXIT
echo "=== the SR-IOV VM tier (vm_sriov), run beside the tests above ==="
cat "$vm_log"
[ "$vm_rc" -eq 0 ] || echo "vm_sriov: FAILED (exit $vm_rc)" >&2
# This build against the previous release (e2e/previous-build), both in release mode, thin and
# daemon, interleaved round by round on one real kube-apiserver: the short form of
# scripts/bench.sh, after the tests so the machine is quiet. Figures only, never a timed test;
# it fails only when the comparison cannot run.
if [ -n "${PLEXUS_K8S_BIN:-}" ]; then
  echo "=== this build against the previous release (plexus-bench --previous, short form) ==="
  prev_release=$(bash scripts/prev-build.sh --release)
  cargo build --release --locked -p plexus-meta -p plexus-shim --bin plexus --bin plexus-daemon --bin plexus-shim
  if [ -n "$prev_release" ]; then
    "$target_dir/debug/plexus-bench" --previous "$prev_release" --iterations 8 \
      --plexus "$target_dir/release/plexus" || rc=1
  fi
fi
[ "$rc" -eq 0 ] && [ "$vm_rc" -eq 0 ]
