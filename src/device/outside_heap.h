// CPU storage for what lives as long as a model and is made while it loads: a quantized
// layer's blocks. From the heap, each of those lands after the temporaries the layer's
// conversion just freed, so the freed memory (resident: it was written) ends up in holes
// between kept weights that later, larger requests do not fit: HiDream-I1's 17B transformer,
// quantized to int8 layer by layer from its bf16 files, kept ~0.43 bytes of freed resident
// heap per byte of weights (out of memory at 23 GiB for 16.9 GiB of int8). In a mapping of its
// own, such a buffer leaves the heap to the load's temporaries, which every layer reuses, and
// goes back to the OS whole when freed.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace diffuse::device {

// Buffers from this size up get a mapping of their own; smaller ones come from the heap, where
// one mapping each would cost more than the hole it avoids.
constexpr int64_t kOutsideHeapMinBytes = int64_t{1} << 20;

// An uninitialised contiguous CPU tensor; from kOutsideHeapMinBytes up, in an anonymous mapping
// of its own (from 2 MiB up aligned to 2 MiB, its whole huge pages advised as such where the heap
// uses them), unmapped when its storage is freed.
at::Tensor empty_outside_heap(at::IntArrayRef sizes, at::ScalarType dtype);

// A contiguous CPU copy of `t` in storage from empty_outside_heap.
at::Tensor copy_outside_heap(const at::Tensor& t);

// Whether `t`'s data lies in a mapping made by empty_outside_heap (for tests and reports).
bool is_outside_heap(const at::Tensor& t);

// The bytes of all such mappings alive now.
int64_t outside_heap_bytes();

}  // namespace diffuse::device
