#!/bin/sh
# Builds switchyard-cni as a static executable and copies it to OUT:
#   ./scripts/build-cni.sh OUT [TARGET_DIR]
# The plugin runs in the host's root, not in the image it came from (Multus
# thick chroots to the host; thin Multus and the runtime run it there), so
# it must not depend on the build machine's shared libraries: glibc is
# linked in statically (the plugin uses no NSS look-ups). The Dockerfile
# and the tests build it with this one script.
set -eu
out=${1:?usage: build-cni.sh OUT [TARGET_DIR]}
cd "$(dirname "$0")/.."
target_dir=${2:-target/static-cni}
# An explicit --target keeps the flag off build scripts and proc macros.
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked -p switchyard-cni --bin switchyard-cni \
  --target "$host" --target-dir "$target_dir" >&2
mkdir -p "$(dirname "$out")"
cp "$target_dir/$host/release/switchyard-cni" "$out.tmp"
mv -f "$out.tmp" "$out"
