#!/usr/bin/env bash
# The full benchmark against the systems Plexus replaces and against the previous release, on a
# real kube-apiserver (run as root, on an otherwise idle machine; ~2 min after the builds):
#   scripts/bench.sh [ROUNDS]    (default 30)
# Builds the previous release (e2e/previous-build) and this tree in release mode, then runs
# Multus thin and thick, this build and the previous one, thin and daemon, in the same
# interleaved rounds (plexus-bench --peers --previous). Figures only: it never fails on them.
# Needs PLEXUS_K8S_BIN (kube-apiserver, etcd) and PLEXUS_PEERS_BIN (Multus), as the tests do.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: run as root (the benchmark creates network namespaces)" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
rounds="${1:-30}"
source scripts/setup.sh
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export PLEXUS_K8S_BIN="${PLEXUS_K8S_BIN:-$(cd ../shared/k8s/bin 2>/dev/null && pwd)}"
export PLEXUS_PEERS_BIN="${PLEXUS_PEERS_BIN:-$(cd ../shared/peers/bin 2>/dev/null && pwd)}"
prev=$(bash scripts/prev-build.sh --release)
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build --release --locked -p plexus-meta -p plexus-shim -p plexus-e2e \
  --bin plexus --bin plexus-daemon --bin plexus-shim --bin plexus-bench
prev_args=()
if [ -n "$prev" ]; then
  prev_args=(--previous "$prev")
  echo "previous release: $(cat "$prev/commit")"
fi
echo "this build: $(git rev-parse --short HEAD 2>/dev/null || echo 'no commit')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
exec "$target_dir/release/plexus-bench" --peers "${prev_args[@]}" --iterations "$rounds" \
  --plexus "$target_dir/release/plexus"
