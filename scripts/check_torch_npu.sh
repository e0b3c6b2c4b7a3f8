#!/usr/bin/env bash
# Compiles every diffuse file that changes under -DDIFFUSE_WITH_TORCH_NPU=ON against a pinned
# torch_npu release's own headers and a LibTorch 2.x include tree, compile-only (no torch_npu
# library, CANN runtime or NPU is needed; nothing links or runs).
#
#   bash scripts/check_torch_npu.sh [--torch-npu GIT_DIR] [--ref REF]
#                                   [--libtorch-include DIR | --libtorch-git GIT_DIR]
#
# torch_npu: a clone of https://github.com/Ascend/pytorch (any clone holding REF; default
# $TORCH_NPU_GIT or /work/.mirror/Ascend+pytorch/repo). REF defaults to the release branch
# v2.3.1-7.0.0 (torch_npu 7.0.0 for torch 2.3.1). Its headers are laid out as its pip wheel
# installs them (setup.py's header globs: torch_npu/include/torch_npu/csrc/**, CANN's ACL and
# HCCL headers that torch_npu ships under third_party/), so the check sees exactly what a user
# of `pip install torch-npu` compiles against.
# LibTorch: the include folder of a LibTorch of the same minor version (a libtorch zip's
# include/, or `python3 -c 'import torch.utils.cpp_extension as c;
# print(c.include_paths())'`), or a git repository that keeps one under libtorch/include
# (default $LIBTORCH_GIT or /work/.mirror/Skyfrei+Warcraft3/repo, LibTorch 2.3.0).
#
# The one file not in torch_npu's source is NPUNativeFunctions.h, which torch_npu's code
# generator writes at build time from native_functions.yaml; the headers diffuse uses include
# it but need nothing from it, so the check gives them an empty one (and says so).
#
# Exit status: 0 when every file compiles, 1 when one does not, 77 when the sources are not
# here (CTest reports the check as skipped; CI machines without the mirrors skip it).
set -euo pipefail
cd "$(dirname "$0")/.."

torch_npu_git=${TORCH_NPU_GIT:-/work/.mirror/Ascend+pytorch/repo}
ref=${TORCH_NPU_REF:-v2.3.1-7.0.0}
libtorch_include=${LIBTORCH_INCLUDE:-}
libtorch_git=${LIBTORCH_GIT:-/work/.mirror/Skyfrei+Warcraft3/repo}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --torch-npu) torch_npu_git=$2; shift 2 ;;
    --ref) ref=$2; shift 2 ;;
    --libtorch-include) libtorch_include=$2; shift 2 ;;
    --libtorch-git) libtorch_git=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "check_torch_npu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

skip() { echo "check_torch_npu: skipped: $*"; exit 77; }
commit=$(git -C "$torch_npu_git" rev-parse -q --verify "$ref^{commit}" 2>/dev/null) ||
  skip "no torch_npu clone with '$ref' at '$torch_npu_git' (--torch-npu, --ref)"

work=$(mktemp -d "${TMPDIR:-/tmp}/diffuse-torch-npu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ -z "$libtorch_include" ]]; then
  git -C "$libtorch_git" rev-parse -q --verify HEAD:libtorch/include >/dev/null 2>&1 ||
    skip "no LibTorch 2.x include folder (--libtorch-include DIR, or --libtorch-git with libtorch/include)"
  git -C "$libtorch_git" archive --prefix=libtorch/include/ HEAD:libtorch/include | tar -x -C "$work"
  libtorch_include=$work/libtorch/include
fi
[[ -f "$libtorch_include/torch/csrc/api/include/torch/version.h" ]] ||
  skip "'$libtorch_include' is not a LibTorch include folder (no torch/csrc/api/include/torch/version.h)"
torch_version=$(sed -n 's/^ *"\([0-9.]*\)".*/\1/p; s/^#define TORCH_VERSION "\([0-9.]*\)".*/\1/p' \
  "$libtorch_include/torch/csrc/api/include/torch/version.h" | head -1)
[[ "${torch_version%%.*}" -ge 2 ]] || { echo "check_torch_npu: LibTorch $torch_version: torch_npu needs 2.x" >&2; exit 1; }

# torch_npu's headers where its wheel puts them: site-packages/torch_npu/include.
src=$work/torch_npu_src
inc=$work/torch_npu_include
mkdir -p "$src" "$inc"
git -C "$torch_npu_git" archive "$commit" torch_npu/csrc third_party/acl/inc third_party/hccl/inc |
  tar -x -C "$src"
(
  cd "$src"
  {
    find torch_npu/csrc -maxdepth 5 -name '*.h'
    find torch_npu/csrc -mindepth 2 -maxdepth 3 -name '*.hpp'
  } | while read -r f; do
    mkdir -p "$inc/$(dirname "$f")"; cp "$f" "$inc/$f"
  done
  find third_party/acl/inc third_party/hccl/inc -name '*.h' | while read -r f; do
    mkdir -p "$inc/$(dirname "$f")"; cp "$f" "$inc/$f"
  done
)
generated=$inc/torch_npu/csrc/aten/NPUNativeFunctions.h
if [[ ! -f "$generated" ]]; then
  echo "// Written by torch_npu's code generator at build time; empty for this compile check." \
    >"$generated"
fi

cxx=${CXX:-g++}
# torch_npu's HCCL process group header includes torch_npu/csrc/npu/Event.h, which includes
# <Python.h>: a C++ program that uses HCCL needs Python's headers (a torch_npu user has them).
python_include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
[[ -f "$python_include/Python.h" ]] ||
  { echo "check_torch_npu: Python's headers are needed (Debian: python3-dev)" >&2; exit 1; }
# As CMake builds diffuse_core with -DDIFFUSE_WITH_TORCH_NPU=ON (cmake/TorchNpu.cmake), with
# torch's c10d folder as an include root: torch_npu's HCCL headers include <c10d/...>.
flags=(-std=c++17 -fsyntax-only -Wall -Wextra -DDIFFUSE_WITH_TORCH_NPU=1 -DDIFFUSE_VERSION='"check"'
       -D_GLIBCXX_USE_CXX11_ABI=1
       -Isrc -Iinclude -isystem "$inc" -isystem "$inc/third_party/acl/inc"
       -isystem "$inc/third_party/hccl/inc" -isystem "$libtorch_include"
       -isystem "$libtorch_include/torch/csrc/api/include"
       -isystem "$libtorch_include/torch/csrc/distributed" -isystem "$python_include")
# The files whose code depends on DIFFUSE_WITH_TORCH_NPU (and what it enables: HCCL, NPU graphs).
files=$(grep -rlE 'DIFFUSE_WITH_TORCH_NPU|DIFFUSE_HAVE_HCCL|DIFFUSE_NPU_GRAPHS' src --include='*.cpp' | sort)
echo "check_torch_npu: torch_npu $ref ($commit), LibTorch $torch_version headers ($libtorch_include), $($cxx --version | head -1)"
failed=0
for f in $files; do
  # Every torch header must come from the LibTorch given, never from a system copy (Debian's
  # libtorch-dev 1.13 in /usr/include would otherwise fill any gap silently).
  deps=$("$cxx" "${flags[@]}" -M "$f" 2>/dev/null | tr ' \\' '\n\n' | grep -E '^/usr/(local/)?include/(torch|ATen|c10|caffe2)/' || true)
  if ! "$cxx" "${flags[@]}" "$f" 2>"$work/err"; then
    echo "FAIL $f"; sed 's/^/  /' "$work/err" | head -40; failed=1; continue
  fi
  if [[ -n "$deps" ]]; then
    echo "FAIL $f reads torch headers outside $libtorch_include:"; echo "$deps" | head -5 | sed 's/^/  /'
    failed=1; continue
  fi
  warnings=$(grep -c 'warning:' "$work/err" || true)
  if [[ $warnings -gt 0 ]]; then echo "ok   $f ($warnings warnings)"; else echo "ok   $f"; fi
done
[[ $failed == 0 ]] && echo "check_torch_npu: every file compiles against torch_npu $ref"
exit $failed
