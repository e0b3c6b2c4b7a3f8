#!/usr/bin/env bash
# Runs a command as if this CPU had less: the engine's kernels and dtype policy
# (DIFFUSE_CPU_ISA), oneDNN (DNNL_MAX_CPU_ISA) and OpenBLAS (OPENBLAS_CORETYPE) are all capped
# to the same level, so the path an AVX2-only desktop or an older Xeon takes can be measured
# side by side with the native one on one machine.
#   scripts/bench_isa.sh avx2 build/diffuse bench --arch sd2.1-base --steps 2
# Levels: avx512 (AVX-512 without bf16/AMX), avx2, baseline (SSE4.1).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 avx512|avx2|baseline COMMAND [ARGS...]" >&2
  exit 2
fi
level="$1"
shift
case "$level" in
  avx512) dnnl=AVX512_CORE; blas=SkylakeX ;;
  avx2) dnnl=AVX2; blas=Haswell ;;
  baseline) dnnl=SSE41; blas=Nehalem ;;
  *) echo "$0: unknown level '$level' (expected avx512, avx2 or baseline)" >&2; exit 2 ;;
esac
export DIFFUSE_CPU_ISA="$level" DNNL_MAX_CPU_ISA="$dnnl" OPENBLAS_CORETYPE="$blas"
exec "$@"
