#!/usr/bin/env bash
# Builds the test binary with AddressSanitizer + UBSan (CMake preset "asan") and runs the
# tests that parse untrusted input: safetensors (incl. the fuzz test), PNG, tokenizer files,
# single-file checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -f build-asan/build.ninja ]; then
  cmake --preset asan >/dev/null
fi
cmake --build --preset asan -- -j"$(nproc)"
# libtorch itself is not instrumented; leak checking would report its global caches.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
build-asan/tests/diffuse_parser_tests
