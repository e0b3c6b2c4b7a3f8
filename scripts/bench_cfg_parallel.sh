#!/usr/bin/env bash
# CFG-parallel speed on the CPU: `txt2img --devices cpu,cpu` (two worker processes, one
# intra-op thread each, Gloo all-gather every step) against one process with two threads on
# the same work. Each runs $REPEAT times (default 3), alternating; the best whole-denoise time
# of each is reported with their ratio (the best, because other load on the machine only ever
# slows a run down, two-thread runs the most).
#
#   scripts/bench_cfg_parallel.sh [MODEL] [STEPS] [SIZE] [EXTRA TXT2IMG FLAGS...]
#
# MODEL defaults to models/demo (128x128). A full-size SD2.1-base with random weights:
#   build/diffuse create-demo-model --arch sd2.1-base -o /tmp/sd21-base
#   scripts/bench_cfg_parallel.sh /tmp/sd21-base 3 512
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DIFFUSE_BIN:-build/diffuse}
MODEL=${1:-models/demo}
STEPS=${2:-20}
SIZE=${3:-0}
shift $(($# < 3 ? $# : 3))
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

args=(txt2img -m "$MODEL" -p "a red circle on the left and a blue square on the right"
      -n "blurry" --steps "$STEPS" --seed 1 --scheduler dpmpp_2m --json "$@")
if [ "$SIZE" != 0 ]; then args+=(-W "$SIZE" -H "$SIZE"); fi
denoise_s() { sed -n 's/.*"denoise_s": *\([0-9.eE+-]*\).*/\1/p'; }

best() { printf '%s\n' "$@" | sort -g | head -1; }
ones=() twos=()
for _ in $(seq "${REPEAT:-3}"); do
  ones+=("$(env -u OMP_NUM_THREADS DIFFUSE_THREADS=2 "$BIN" "${args[@]}" --device cpu \
            -o "$OUT/one.png" | denoise_s)")
  twos+=("$(env -u OMP_NUM_THREADS DIFFUSE_THREADS=1 "$BIN" "${args[@]}" --devices cpu,cpu \
            -o "$OUT/two.png" | denoise_s)")
done
echo "runs (s): one process ${ones[*]}; cpu,cpu ${twos[*]}"
one=$(best "${ones[@]}")
two=$(best "${twos[@]}")
echo "model $MODEL, $STEPS steps, size ${SIZE/#0/default}"
echo "one process, 2 threads:          denoise ${one} s"
echo "--devices cpu,cpu, 1 thread each: denoise ${two} s"
awk -v a="$one" -v b="$two" 'BEGIN { printf "speed-up of CFG-parallel: %.2fx\n", a / b }'
