#!/usr/bin/env bash
# Builds the components of the release release.toml names (cloud-gateway
# and the three controllers) from its commit, once: they are kept in
# $CARGO_TARGET_DIR/previous-release/<commit>/bin and reused while the
# commit stays the same. Prints the directory of the binaries.
#
# The build has a target directory of its own, removed once the binaries
# are out: cargo tells a path package's artifacts apart by its path within
# the workspace, so the old tree's crates would overwrite this tree's in a
# shared one. The gateway is built without the AWS provider (the skew run
# is on the sim), which leaves the AWS SDK out: a few minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
commit="$(sed -n 's/^commit *= *"\([0-9a-f]*\)".*/\1/p' "$root/tools/previous-release/release.toml")"
[[ -n "$commit" ]] || { echo "no commit in tools/previous-release/release.toml" >&2; exit 1; }
target="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
out="$target/previous-release/$commit"
components=(cloud-gateway node-controller service-controller route-controller)
if [[ -f "$out/bin/.complete" ]]; then
  echo "$out/bin"
  exit 0
fi
if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "commit $commit (the previous release) is not in this clone; a shallow clone needs: git fetch --unshallow" >&2
  exit 1
fi
# Other commits' binaries are no longer wanted.
rm -rf "$target/previous-release"
# A clone of its own, checked out at the commit: its build script names
# that commit, as the release's binaries do.
git clone --quiet --no-checkout "$root" "$out/src"
git -C "$out/src" -c advice.detachedHead=false checkout --quiet --detach "$commit"
packages=()
for c in "${components[@]}"; do packages+=(-p "$c"); done
echo "building the previous release ($commit) into $out" >&2
(cd "$out/src" && CARGO_TARGET_DIR="$out/target" CARGO_INCREMENTAL=0 \
  cargo build --locked --bins --no-default-features "${packages[@]}" >&2)
mkdir -p "$out/bin.partial"
for c in "${components[@]}"; do cp "$out/target/debug/$c" "$out/bin.partial/$c"; done
touch "$out/bin.partial/.complete"
mv "$out/bin.partial" "$out/bin"
rm -rf "$out/target" "$out/src"
echo "$out/bin"
