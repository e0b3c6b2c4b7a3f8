// The CPU flash-attention kernels behind nn::attention's `flash` backend: tiled attention
// with an online softmax, so memory stays O(tokens) instead of O(tokens^2).
//
// This header is plain C++ (no torch) on purpose: the kernels are compiled once per
// instruction set (baseline, AVX2, AVX-512, AVX-512 + BF16) in translation units with their
// own compiler flags, and those units must not instantiate templates shared with the rest of
// the program (the linker could keep an AVX-512 copy for everyone). flash.cpp picks the best
// kernel the CPU supports at run time.
#pragma once
#include <cstdint>

namespace diffuse::nn::flash {

// One attention call: q [B, H, Nq, D], k and v [B, H, Nk, D], out [B, H, Nq, D], each given by
// a base pointer and element strides for (batch, head, token); the last dimension is
// contiguous. A stride may be 0 (broadcast).
struct Problem {
  int64_t batch = 0, heads = 0, nq = 0, nk = 0, head_dim = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  int64_t out_stride[3] = {0, 0, 0};
  bool bf16 = false;    // q, k, v and out are bfloat16; otherwise float32
  float scale = 1.0f;   // > 0
  bool causal = false;  // query i attends to keys j <= i
};

// A kernel for one instruction set. Per (batch, head) the caller packs K and V once into
// `packed_bytes` bytes, then runs `attend` on blocks of at most `block_rows` query rows, each
// with its own `scratch_bytes` of scratch memory. Buffers must be 64-byte aligned.
struct Kernel {
  const char* name;
  int64_t block_rows;
  int64_t (*packed_bytes)(const Problem& p);
  void (*pack)(const Problem& p, int64_t b, int64_t h, void* packed);
  int64_t (*scratch_bytes)(const Problem& p);
  void (*attend)(const Problem& p, int64_t b, int64_t h, int64_t row_begin, int64_t row_end,
                 const void* packed, void* scratch);
};

// Kernels compiled into this build, or nullptr. Whether the running CPU can execute them is
// flash.cpp's business.
const Kernel* portable_kernel();     // any CPU (baseline ISA, compiler-vectorised)
const Kernel* avx2_kernel();         // AVX2 + FMA (compiler-vectorised)
const Kernel* avx512_kernel();       // AVX-512 F/BW/VL/DQ intrinsics, fp32 math
const Kernel* avx512_bf16_kernel();  // bf16 inputs: AVX512-BF16 dot products, fp32 sums

}  // namespace diffuse::nn::flash
