#!/usr/bin/env bash
# The Debian package (CTest deb_package): cpack -G DEB, its control fields, its files, and the
# CLI and library run from the unpacked tree. (Installing it with dpkg -i needs root and changes
# the machine, so the test unpacks instead; the README says how to install it.)
# Usage: deb.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work" >/dev/null
deb=$(ls "$work"/diffuse_*.deb)
dpkg-deb --info "$deb" > "$work/info.txt"
grep -q '^ Package: diffuse$' "$work/info.txt"
# dpkg-shlibdeps found the libraries the binaries link (LibTorch among them).
grep -E '^ Depends: .*libtorch' "$work/info.txt" >/dev/null || { cat "$work/info.txt"; exit 1; }
dpkg-deb --contents "$deb" > "$work/contents.txt"
for f in ./usr/bin/diffuse ./usr/include/diffuse/diffuse.h ./usr/share/diffuse/models/demo/model_index.json \
         ./usr/lib/python3/dist-packages/diffuse/__init__.py; do
  grep -q " $f\$" "$work/contents.txt" || { echo "not in the package: $f" >&2; exit 1; }
done
dpkg-deb -x "$deb" "$work/root"
"$work/root/usr/bin/diffuse" --version
"$work/root/usr/bin/diffuse" txt2img -m "$work/root/usr/share/diffuse/models/demo" --device cpu --steps 2 \
  --seed 1 -q -p "a green square in the center on a white background" -o "$work/deb.png"
[ -s "$work/deb.png" ]
echo "deb_package: ok ($(du -h "$deb" | cut -f1) $(basename "$deb"))"
