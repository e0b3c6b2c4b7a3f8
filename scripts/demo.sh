#!/usr/bin/env bash
# Installs what is missing, builds, draws a picture with the demo model kept in models/demo
# (trained by `diffuse train-demo` on a world of coloured shapes; see README), then edits that
# picture by instruction with the HiDream-architecture demo model in models/demo-edit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The CLI alone: the tests, the sanitizer library and the rest build with scripts/test.sh.
bash scripts/build.sh diffuse >/dev/null
out="${DIFFUSE_DEMO_OUT:-demo.png}"
build/diffuse txt2img --model models/demo \
  --prompt "${DIFFUSE_DEMO_PROMPT:-a red circle on the left and a blue square on the right on a yellow background}" \
  --seed 42 --steps 20 --out "$out" "$@"
edited="${out%.png}-edit.png"
# E1's prompt format names the instruction and the result; with a prompt of your own, the bare
# instruction (the model takes both).
edit_prompt="Editing Instruction: make the background green. Target Image Description: a red circle on the left and a blue square on the right on a green background."
[ -n "${DIFFUSE_DEMO_PROMPT:-}" ] && edit_prompt="make the background green"
echo "the image is in $(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
# The editing model ships once trained (`diffuse train-demo --arch hidream-e1`, see README).
if [ -f models/demo-edit/model_index.json ]; then
  build/diffuse edit --model models/demo-edit --image "$out" --seed 42 --out "$edited" --quiet \
    --prompt "${DIFFUSE_DEMO_EDIT:-$edit_prompt}"
  echo "its edit is in $(cd "$(dirname "$edited")" && pwd)/$(basename "$edited")"
fi
