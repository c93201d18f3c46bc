#!/usr/bin/env bash
# Build the previous plexus (the commit named in e2e/previous-build).
#   prev-build.sh            dev profile, for the churn tier's upgrade and roll-back cases: its
#                            binaries and its install.sh go to <target>/prev-build/.
#   prev-build.sh --release  release profile, for the benchmark that runs it side by side with
#                            this build (plexus-bench --previous): <target>/prev-release/.
# The directory is printed on stdout. Uses the same target dir, so the dependencies already
# built for that profile are reused and only the workspace's own crates are compiled (~1-2 min;
# the release build's first run also builds its dependencies, in <target>/prev-target).
# Prints nothing (and says why on stderr) when the commit is not in this checkout (a tarball or
# a shallow clone): the cases then report that they did not run.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=dev
[ "${1:-}" = "--release" ] && profile=release
commit=$(tr -d ' \n' <e2e/previous-build)
target_dir=$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)
if [ "$profile" = release ]; then
	out=$target_dir/prev-release
	# A target dir of its own: building it in target/release would make the next release build
	# of this tree recompile the workspace, and this one after it, on every run.
	build_target=$target_dir/prev-target
	built=$build_target/release
	build_flags=(--release -p plexus-meta -p plexus-shim -p plexus-sriov)
else
	out=$target_dir/prev-build
	build_target=$target_dir
	built=$target_dir/debug
	# The current profile (the earlier commit's Cargo.toml may differ), so that dependencies
	# built for this tree are reused.
	build_flags=(--workspace --config 'profile.dev.debug="line-tables-only"'
		--config 'profile.dev.package."*".debug=false')
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
	echo "prev-build: commit $commit is not in this checkout; the cases that need it will not run" >&2
	exit 0
fi
if [ -f "$out/commit" ] && [ "$(cat "$out/commit")" = "$commit" ]; then
	echo "$out"
	exit 0
fi
src=$target_dir/prev-src-$profile
rm -rf "$src" "$out"
mkdir -p "$src" "$out"
git archive "$commit" | tar -x -C "$src"
(cd "$src" && cargo build --bins --locked --quiet --target-dir "$build_target" "${build_flags[@]}") >&2
for b in plexus plexus-daemon plexus-shim sriov; do
	cp "$built/$b" "$out/$b"
done
cp "$src/deploy/install.sh" "$out/install.sh"
echo "$commit" >"$out/commit"
rm -rf "$src"
echo "$out"
