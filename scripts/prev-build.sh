#!/usr/bin/env bash
# Build the previous plexus (the commit named in e2e/previous-build) for the churn tier's upgrade
# and roll-back cases: its binaries and its install.sh go to <target>/prev-build/, which is
# printed on stdout. Uses the same target dir and the current dev profile, so the dependencies
# already built are reused and only the workspace's own crates are compiled (~2 min).
# Prints nothing (and says why on stderr) when the commit is not in this checkout (a tarball or
# a shallow clone): the cases then report that they did not run.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(tr -d ' \n' <e2e/previous-build)
target_dir=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
out=$target_dir/prev-build
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
	echo "prev-build: commit $commit is not in this checkout; the upgrade cases will not run" >&2
	exit 0
fi
if [ -f "$out/commit" ] && [ "$(cat "$out/commit")" = "$commit" ]; then
	echo "$out"
	exit 0
fi
src=$target_dir/prev-src
rm -rf "$src" "$out"
mkdir -p "$src" "$out"
git archive "$commit" | tar -x -C "$src"
# The current profile (the earlier commit's Cargo.toml may differ), so that dependencies built
# for this tree are reused.
(cd "$src" && cargo build --workspace --bins --locked --quiet --target-dir "$target_dir" \
	--config 'profile.dev.debug="line-tables-only"' \
	--config 'profile.dev.package."*".debug=false') >&2
for b in plexus plexus-daemon plexus-shim sriov; do
	cp "$target_dir/debug/$b" "$out/$b"
done
cp "$src/deploy/install.sh" "$out/install.sh"
echo "$commit" >"$out/commit"
rm -rf "$src"
echo "$out"
