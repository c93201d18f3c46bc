#!/usr/bin/env bash
# Run every cargo-fuzz (libFuzzer) target of fuzz/ for SECONDS each (default 60) and print one
# line per target: executions, corpus size, and OK or the crash artifact. Exits 1 when any
# target found a crash or hang. See docs/fuzzing.md. Needs no root.
#   scripts/fuzz.sh [seconds-per-target] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

# cargo-fuzz builds with -Zsanitizer=address: a nightly toolchain, or, when rustup cannot fetch
# one, the pinned stable with RUSTC_BOOTSTRAP=1 (unstable flags allowed on a stable compiler).
# PLEXUS_FUZZ_NO_NIGHTLY=1 forces the fallback.
toolchain=()
if [ -z "${PLEXUS_FUZZ_NO_NIGHTLY:-}" ] && { rustup run nightly rustc --version >/dev/null 2>&1 \
  || rustup toolchain install nightly --profile minimal >/dev/null 2>&1; }; then
  toolchain=(+nightly)
  echo "toolchain: $(rustup run nightly rustc --version)" >&2
else
  export RUSTC_BOOTSTRAP=1
  echo "toolchain: no nightly; $(rustc --version) with RUSTC_BOOTSTRAP=1" >&2
fi

cd fuzz
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list)
cargo "${toolchain[@]}" fuzz build -O
failed=0
printf '%-14s %12s %8s  %s\n' target executions corpus result
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a leak or blow-up.
  if cargo "${toolchain[@]}" fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -dict=dicts/json.dict -print_final_stats=1 >"$log" 2>&1; then
    result=OK
  else
    result="FAILED: $(grep -o 'artifacts/[^ ]*' "$log" | tail -1) (log: $log)"
    failed=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  corpus=$(find "corpus/$t" -type f | wc -l)
  printf '%-14s %12s %8s  %s\n' "$t" "${runs:-?}" "$corpus" "$result"
  [ "$result" != OK ] || rm -f "$log"
done
exit "$failed"
