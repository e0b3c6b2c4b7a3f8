#!/usr/bin/env bash
# Builds the libFuzzer harnesses of the parsers (tests/fuzz, clang + ASan + UBSan) and runs
# each for FUZZ_SECONDS (default 60) on a copy of its seed corpus (tests/fuzz/corpus/<name>).
# Prints each harness's runs, coverage (cov) and features (ft); fails if any finds a crash, a
# leak-free sanitizer report or a timeout, keeping the input under build-fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SECONDS_EACH="${FUZZ_SECONDS:-60}"
if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDIFFUSE_FUZZ=ON \
    -DDIFFUSE_BUILD_TESTS=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
HARNESSES=(png safetensors json_config clip_tokenizer llama_tokenizer lora gguf)
cmake --build build-fuzz -- -j"$(nproc)" "${HARNESSES[@]/#/fuzz_}"
# libtorch is not instrumented and keeps global caches: no leak checking.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p build-fuzz/findings
status=0
for name in "${HARNESSES[@]}"; do
  mkdir -p "$work/$name"
  cp tests/fuzz/corpus/"$name"/* "$work/$name"/
  log="$work/$name.log"
  if build-fuzz/tests/fuzz/fuzz_"$name" "$work/$name" -max_total_time="$SECONDS_EACH" \
       -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix=build-fuzz/findings/"$name"- >"$log" 2>&1; then
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
    last=$(grep -E '#[0-9]+.*(DONE|cov:)' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
    echo "fuzz $name: ${runs:-?} runs in ${SECONDS_EACH} s, ${last:-no stats}"
  else
    echo "fuzz $name: FAILED (input kept under build-fuzz/findings/)"
    tail -40 "$log"
    status=1
  fi
done
exit $status
