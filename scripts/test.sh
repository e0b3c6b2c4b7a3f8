#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest + GoogleTest).
# Golden tests read ../shared/golden/sd21-tiny, or the set named by DIFFUSE_GOLDEN_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd "${DIFFUSE_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" "$@"
