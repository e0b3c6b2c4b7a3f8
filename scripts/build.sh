#!/usr/bin/env bash
# Configures (once) and builds diffuse in ./build (Release). Incremental and fast when nothing changed.
# Usage: build.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DIFFUSE_BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
# Targets to build may be named (`build.sh diffuse`: the CLI alone, what scripts/demo.sh needs);
# none builds everything, the tests included.
targets=()
for t in "$@"; do targets+=(--target "$t"); done
# Two parallel jobs per GiB of headroom would be nicer, but torch translation units need ~1.5 GiB each.
cmake --build "$BUILD_DIR" "${targets[@]}" -- -j"$(nproc)"
