#!/usr/bin/env bash
# The installed tree as a user gets it (CTest install_consumer): `cmake --install` into a fresh
# prefix, then a project outside the repository built against it with find_package(diffuse) (a C
# and two C++ programs: one without LibTorch's headers, one on pipeline.h through
# find_package(diffuse COMPONENTS torch)) and with pkg-config, the installed
# CLI, and the installed Python module. Each must produce the same image for the same seed.
# Usage: run.sh BUILD_DIR SOURCE_DIR LIBDIR PYTHON WORK_DIR
set -euo pipefail
build=$1 src=$2 libdir=$3 py=$4 work=$5
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
model="$prefix/share/diffuse/models/demo"
for f in "bin/diffuse" "$libdir/libdiffuse.so.0" "$libdir/libdiffuse_sentencepiece.so" \
         "include/diffuse/diffuse.h" "$libdir/cmake/diffuse/diffuseConfig.cmake" \
         "$libdir/pkgconfig/diffuse.pc" "share/diffuse/models/demo/model_index.json"; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done

# find_package(diffuse) from an outside project.
cmake -S "$src/tests/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer" "$model" "$work/find_package.png"
"$work/consumer/consumer_cpp" "$model" "$work/cpp.png"
cmp "$work/find_package.png" "$work/cpp.png"
"$work/consumer/consumer_torch" "$model" "$work/torch.png"
cmp "$work/find_package.png" "$work/torch.png"

# pkg-config.
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c99 -o "$work/consumer-pc" "$src/tests/consumer/consumer.c" $(pkg-config --cflags --libs diffuse)
LD_LIBRARY_PATH="$prefix/$libdir" "$work/consumer-pc" "$model" "$work/pkg-config.png"
cmp "$work/find_package.png" "$work/pkg-config.png"

# The installed CLI (finds its SentencePiece shim in ../lib).
"$prefix/bin/diffuse" --version
"$prefix/bin/diffuse" txt2img -m "$model" --device cpu --dtype fp32 --steps 3 --seed 42 -q \
  -p "a red circle on the left and a blue square on the right on a yellow background" -o "$work/cli.png"

# The installed Python module finds the installed library by itself.
PYTHONPATH="$prefix/lib/python3/dist-packages" DIFFUSE_LIBRARY= "$py" - "$model" "$work" <<'PY'
import sys, numpy as np, diffuse
model, work = sys.argv[1], sys.argv[2]
assert diffuse._capi._candidates()[0].startswith(work), diffuse._capi._candidates()
p = diffuse.Pipeline(model, device="cpu", dtype="fp32")
img = p.txt2img("a red circle on the left and a blue square on the right on a yellow background",
                steps=3, seed=42)
ref = diffuse.read_png(work + "/find_package.png")
assert np.array_equal(img, ref), "Python and C gave different images"
print("python: same image as the C consumer", img.shape)
PY
echo "install_consumer: ok"
