#!/usr/bin/env bash
# Installs what is missing, builds, and generates an image with the demo model kept in
# models/demo (random weights: the output is structured noise, see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
build/diffuse txt2img --model models/demo \
  --prompt "${DIFFUSE_DEMO_PROMPT:-a watercolor painting of a fox in the snow}" \
  --seed 42 --steps 20 --out "${DIFFUSE_DEMO_OUT:-demo.png}" "$@"
