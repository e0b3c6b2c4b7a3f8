#include "npu_sim/sim_tensors.h"

#include <ATen/EmptyTensor.h>
#include <torch/torch.h>

#include <cstring>
#include <stdexcept>

namespace diffuse::device::sim {
namespace {

constexpr auto kSim = c10::DeviceType::PrivateUse1;

void delete_storage_ref(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}

at::Tensor with_storage(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                    like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides());
  t.unsafeGetTensorImpl()->set_storage_offset(like.storage_offset());
  return t;
}

void* storage_data(const c10::Storage& s) {
  return s.data_ptr().get();
}

}  // namespace

bool is_simulated(const at::Tensor& t) {
  return t.defined() && t.device().type() == kSim;
}

at::Tensor cpu_alias(const at::Tensor& t) {
  const c10::Storage& src = t.storage();
  c10::DataPtr ptr(storage_data(src), new c10::Storage(src), &delete_storage_ref,
                   c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), src.nbytes(), std::move(ptr),
                       /*allocator=*/nullptr,
                       /*resizable=*/false);
  return with_storage(std::move(storage), c10::DispatchKey::CPU, t);
}

at::Tensor wrap_as_simulated(const at::Tensor& cpu, c10::DeviceIndex index) {
  // Copying into a fresh simulated allocation keeps the allocator's statistics exact (a
  // borrowed CPU buffer would be invisible to them); the CPU result is freed right after.
  auto out = at::detail::empty_strided_generic(cpu.sizes(), cpu.strides(), allocator_for(index),
                                               c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                               cpu.scalar_type());
  at::Tensor result(std::move(out));
  if (cpu.numel() > 0) {
    if (cpu.is_non_overlapping_and_dense() && cpu.storage_offset() == 0 &&
        static_cast<size_t>(cpu.numel() * cpu.element_size()) <= cpu.storage().nbytes()) {
      std::memcpy(result.data_ptr(), cpu.data_ptr(), cpu.numel() * cpu.element_size());
    } else {
      cpu_alias(result).copy_(cpu);
    }
  }
  return result;
}

void resize_simulated(const at::Tensor& self, c10::IntArrayRef size,
                      c10::optional<c10::MemoryFormat> format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && !format) return;
  impl->set_sizes_contiguous(size);
  if (format) impl->empty_tensor_restride(*format);
  size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                   self.element_size(), self.storage_offset());
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed <= storage->nbytes()) return;
  if (!storage->resizable())
    throw std::runtime_error("simulated npu: resize_ of a non-resizable storage");
  c10::Allocator* alloc = allocator_for(self.device().has_index() ? self.device().index() : 0);
  c10::DataPtr fresh = alloc->allocate(needed);
  if (storage->nbytes() > 0) std::memcpy(fresh.get(), storage->data_ptr().get(), storage->nbytes());
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(needed);
}

std::vector<int64_t> int_list(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef())
    out.push_back(e.isInt() ? e.toInt() : e.toSymInt().expect_int());
  return out;
}

void run_on_shared_memory(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  std::vector<at::Tensor> originals(n);
  c10::optional<c10::DeviceIndex> index;
  auto note = [&](const at::Tensor& t) {
    if (!index) index = t.device().has_index() ? t.device().index() : 0;
  };
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!is_simulated(t)) continue;
      note(t);
      originals[i] = t;
      v = cpu_alias(t);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorVector();
      for (auto& t : list) {
        if (is_simulated(t)) {
          note(t);
          t = cpu_alias(t);
        }
      }
      v = c10::IValue(c10::List<at::Tensor>(list));
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  const auto& returns = schema.returns();
  const size_t rbegin = stack->size() - returns.size();
  for (size_t j = 0; j < returns.size(); ++j) {
    c10::IValue& r = (*stack)[rbegin + j];
    const c10::AliasInfo* info = returns[j].alias_info();
    if (info && info->isWrite()) {
      // An in-place result: the CPU kernel wrote through the alias; hand back the original.
      bool found = false;
      for (size_t i = 0; i < n && !found; ++i) {
        const c10::AliasInfo* ai = schema.arguments()[i].alias_info();
        if (ai && *ai == *info && originals[i].defined()) {
          r = originals[i];
          found = true;
        }
      }
      if (!found)
        throw std::runtime_error("simulated npu: cannot map the in-place result of " +
                                 schema.name());
    } else if (r.isTensor() && r.toTensor().defined() && index) {
      r = wrap_as_simulated(r.toTensor(), *index);
    } else if (r.isTensorList() && index) {
      std::vector<at::Tensor> list = r.toTensorVector();
      for (auto& t : list)
        if (t.defined()) t = wrap_as_simulated(t, *index);
      r = c10::IValue(c10::List<at::Tensor>(list));
    }
  }
}

}  // namespace diffuse::device::sim
