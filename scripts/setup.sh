#!/usr/bin/env bash
# Installs the Debian 12 packages diffuse needs, only those that are missing (fast when all
# are present). Needs root or sudo for apt-get.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-pthread libicu-dev libsentencepiece-dev libpcre2-dev
  nlohmann-json3-dev libcli11-dev libpng-dev libcpp-httplib-dev libgtest-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
