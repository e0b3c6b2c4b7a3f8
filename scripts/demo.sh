#!/usr/bin/env bash
# Installs what is missing, builds, and draws a picture with the demo model kept in
# models/demo (trained by `diffuse train-demo` on a world of coloured shapes; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
out="${DIFFUSE_DEMO_OUT:-demo.png}"
build/diffuse txt2img --model models/demo \
  --prompt "${DIFFUSE_DEMO_PROMPT:-a red circle on the left and a blue square on the right on a yellow background}" \
  --seed 42 --steps 20 --out "$out" "$@"
echo "the image is in $(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
