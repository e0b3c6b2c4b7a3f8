#!/usr/bin/env bash
# Installs the Debian 12 packages diffuse needs, only those that are missing (fast when all
# are present). Needs root or sudo for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libonnx-dev libprotobuf-dev libdnnl-dev libgloo-dev libopencv-dev libopenblas0-pthread libicu-dev libsentencepiece-dev libpcre2-dev
  nlohmann-json3-dev libcli11-dev libpng-dev libjpeg-dev libwebp-dev libcpp-httplib-dev libssl-dev libgtest-dev
  chromium chromium-driver
  clang libclang-rt-14-dev
  python3-numpy python3-pytest python3-pil
)
# Node.js + npm drive the browser test (tests/browser); a Node.js from elsewhere is kept.
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# playwright-core for the browser test, from the npm registry at the version in
# tests/browser/package-lock.json (it drives Debian's Chromium; no browser download).
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  (cd tests/browser && npm ci --no-audit --no-fund >/dev/null)
fi
# ONNX Runtime (CPU) for the ONNX export test, at the version in tests/onnx/package-lock.json.
# --ignore-scripts: its install script downloads GPU libraries; the CPU runtime is in the package.
if [ ! -d tests/onnx/node_modules/onnxruntime-node ]; then
  (cd tests/onnx && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
fi
