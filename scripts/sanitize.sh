#!/usr/bin/env bash
# Builds with AddressSanitizer + UBSan (CMake preset "asan", build-asan) and runs tests there.
#   bash scripts/sanitize.sh        the tests that parse untrusted input: safetensors (incl. the
#                                   fuzz test), PNG, tokenizer files, single-file checkpoints
#                                   (CI's sanitizer job, about 2 minutes)
#   bash scripts/sanitize.sh --all  the library, CLI and every test program, then the whole
#                                   suite under CTest (about 30 minutes on 2 cores: before a
#                                   change that handles memory, lifetimes or references lands)
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
case "${1:-}" in
  "") ;;
  --all) all=1 ;;
  *) echo "usage: bash scripts/sanitize.sh [--all]" >&2; exit 2 ;;
esac
bash scripts/setup.sh
if [ ! -f build-asan/build.ninja ]; then
  cmake --preset asan >/dev/null
fi
# libtorch itself is not instrumented; leak checking would report its global caches.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ "$all" = 1 ]; then
  cmake --build build-asan -- -j"$(nproc)"
  cd build-asan
  ctest --output-on-failure -j"$(nproc)"
else
  cmake --build --preset asan -- -j"$(nproc)"
  build-asan/tests/diffuse_parser_tests
fi
