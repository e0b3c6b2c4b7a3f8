#!/usr/bin/env bash
# diffuse against diffusers on one CUDA GPU, side by side in one run (docs/cuda.md):
# the SD2.1-base UNet step (512x512, batch 2, fp16) in diffuse's layouts and modes and in
# diffusers eager and compiled, the VAE decode, the whole 20-step image from one folder (the
# same random weights on both sides, and the two images compared), and one full-size
# HiDream-I1 block of each kind. Every number is put against the roofline diffuse measures
# in the same run; the last lines are the table docs/cuda.md takes.
#
#   scripts/bench_gpu_peers.sh OUT_DIR [DIFFUSE_BINARY]
#
# Needs a CUDA build of diffuse (docs/cuda.md) and python3 with torch, diffusers and
# transformers (PYTHONPATH may point at source trees: the script downloads nothing).
# PEERS_BUDGET_S bounds the diffusers half (default 300 s), or PEERS_DEADLINE (seconds since
# the epoch) the whole run: torch.compile phases that would not fit are skipped and said so.
# PEERS_PARTS picks parts (default: steps image txt2img hidream diffusers); PEERS_PHASES
# passes a phase list to the diffusers half (bench_gpu_peers.py --phases).
set -u
out=${1:?usage: scripts/bench_gpu_peers.sh OUT_DIR [DIFFUSE_BINARY]}
diffuse=${2:-build-cuda/diffuse}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
model=${PEERS_MODEL:-$out/sd21-base}
stamp() { echo "[peers $(date +%H:%M:%S)] $*"; }

if [ ! -f "$model/model_index.json" ]; then
  stamp "writing a random-weight SD2.1-base folder to $model"
  "$diffuse" create-demo-model --arch sd2.1-base -o "$model" || exit 1
fi

bench() {  # TAG ENV... -- FLAGS...
  local tag=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  stamp "diffuse $tag: ${envs[*]} $*"
  env "${envs[@]}" timeout 120 "$diffuse" bench --device cuda --dtype fp16 --vae-dtype fp16 \
    --attention sdpa "$@" --json >"$out/diffuse_$tag.json" 2>"$out/diffuse_$tag.log" ||
    { stamp "diffuse $tag failed:"; tail -5 "$out/diffuse_$tag.log"; }
}

parts=" ${PEERS_PARTS:-steps image txt2img hidream diffusers} "
part() { [[ "$parts" == *" $1 "* ]]; }

steps="--arch sd2.1-base --steps 20 --warmup 5 --no-text-encoder"
if part steps; then
  bench default DIFFUSE_CUDNN_BENCHMARK=0 -- $steps
  # One roofline (the default mode's) serves every row of the table.
  bench cudnn_benchmark DIFFUSE_CUDNN_BENCHMARK=1 -- $steps --no-roofline
  bench channels_last DIFFUSE_CUDNN_BENCHMARK=1 DIFFUSE_CHANNELS_LAST=1 -- $steps --no-roofline
  bench graph DIFFUSE_CUDNN_BENCHMARK=1 -- $steps --graph --no-roofline
  bench graph_channels_last DIFFUSE_CUDNN_BENCHMARK=1 DIFFUSE_CHANNELS_LAST=1 -- $steps --graph \
    --no-roofline
fi
image="-m $model --whole-image 20 --whole-image-runs 4 --no-unet --no-vae --no-text-encoder --no-roofline"
if part image; then
  bench image_default DIFFUSE_CUDNN_BENCHMARK=0 -- $image
  bench image_best ${BEST_ENV:-DIFFUSE_CUDNN_BENCHMARK=1 DIFFUSE_CHANNELS_LAST=1} -- $image --graph
fi

# The same seed with and without --graph: the files must be equal byte for byte.
gen() {  # DTYPE FLAGS...
  local dtype=$1
  shift
  "$diffuse" txt2img -m "$model" --device cuda --dtype "$dtype" --vae-dtype "$dtype" --steps 20 \
    --scheduler dpmpp_2m --cfg-scale 7.5 --seed 1 -p "a photograph of an astronaut riding a horse" \
    "$@" 2>>"$out/txt2img.log"
}
if part txt2img; then
  stamp "txt2img eager and --graph"
  gen fp16 -o "$out/diffuse_image.png" >/dev/null && gen fp16 --graph -o "$out/diffuse_image_graph.png" >/dev/null
  if cmp -s "$out/diffuse_image.png" "$out/diffuse_image_graph.png"; then
    stamp "--graph image: byte-identical to the eager image"
  else
    stamp "--graph image: DIFFERS from the eager image (or a run failed; see txt2img.log)"
  fi
  # float32 (TF32 off) for the comparison with diffusers' float32 pipeline (--summarize).
  gen fp32 -o "$out/diffuse_image_fp32.png" >/dev/null || stamp "fp32 txt2img failed (txt2img.log)"
fi

if part hidream; then
  for attention in ${HIDREAM_ATTENTION:-auto}; do
    tag=hidream$([ "$attention" = auto ] || echo "_$attention")
    stamp "diffuse HiDream-I1 blocks, attention $attention"
    timeout 120 "$diffuse" bench --arch hidream-i1 --device cuda --dtype bf16 --steps 10 --warmup 3 \
      --attention "$attention" --json >"$out/diffuse_$tag.json" 2>"$out/diffuse_$tag.log" ||
      { stamp "diffuse $tag failed:"; tail -5 "$out/diffuse_$tag.log"; }
  done
fi

budget=${PEERS_BUDGET_S:-300}
if [ -n "${PEERS_DEADLINE:-}" ]; then
  budget=$((PEERS_DEADLINE - $(date +%s)))
  [ "$budget" -lt 60 ] && budget=60
fi
part diffusers && stamp "diffusers (budget $budget s)" && PYTHONUNBUFFERED=1 timeout $((budget + 60)) python3 "$here/bench_gpu_peers.py" --model "$model" --out "$out/diffusers.json" \
  --budget-s "$budget" --phases "${PEERS_PHASES:-}" 2>&1 | tee "$out/diffusers.log" | grep -v "^\s*$" | tail -n 40

stamp "summary"
python3 "$here/bench_gpu_peers.py" --summarize --dir "$out" | tee "$out/summary.txt"
