// Tensor plumbing of the simulated npu: host-memory aliases between the simulated device and
// the CPU, so CPU kernels can run on simulated tensors without copying.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <torch/types.h>

#include <vector>

namespace diffuse::device::sim {

bool is_simulated(const at::Tensor& t);
// A CPU tensor on the same memory (same sizes, strides, offset); keeps the storage alive.
at::Tensor cpu_alias(const at::Tensor& t);
// A simulated tensor with a CPU tensor's values and strides (copied into simulated memory, so
// the allocator statistics see every simulated byte).
at::Tensor wrap_as_simulated(const at::Tensor& cpu, c10::DeviceIndex index);
// resize_ for simulated tensors: grows the storage through the simulated allocator.
void resize_simulated(const at::Tensor& self, c10::IntArrayRef size,
                      c10::optional<c10::MemoryFormat> format);
// int[] / SymInt[] IValue -> sizes.
std::vector<int64_t> int_list(const c10::IValue& v);
c10::Allocator* allocator_for(c10::DeviceIndex index);

// Boxed kernel of the natively simulated operators: simulated tensor arguments become CPU
// aliases, the CPU kernel runs on them (reading and writing device memory in place), fresh
// results move into simulated memory, and mutated arguments come back as the originals.
void run_on_shared_memory(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace diffuse::device::sim
