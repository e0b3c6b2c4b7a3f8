#include "npu_sim/simulated_npu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "device/cpu_fallback.h"
#include "npu_sim/sim_tensors.h"

// libtorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DIFFUSE_SIM_ALLOCATE_CONST
#define DIFFUSE_SIM_HAS_COPY_DATA 1
#else
#define DIFFUSE_SIM_ALLOCATE_CONST const
#endif

namespace diffuse::device::sim {
namespace {

constexpr c10::DeviceIndex kMaxDevices = 8;
constexpr auto kSimType = c10::DeviceType::PrivateUse1;

struct DeviceCounters {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> init_calls{0};
  std::atomic<bool> seeded{false};
  std::atomic<uint64_t> seed{0};
};

struct State {
  std::mutex mu;
  std::array<DeviceCounters, kMaxDevices> counters;
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> empty_cache_calls{0};
  std::atomic<int64_t> graph_captures{0};
  std::atomic<int64_t> graph_replays{0};
  NpuCapabilities capabilities;
  bool kernels_registered = false;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

State& state() {
  static State s;
  return s;
}

thread_local c10::DeviceIndex tl_current_device = 0;

void account(c10::DeviceIndex index, int64_t delta) {
  auto& c = state().counters.at(static_cast<size_t>(index));
  int64_t now = c.allocated.fetch_add(delta) + delta;
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

// Host memory that says it lives on npu:<index>.
struct Block {
  void* data;
  int64_t bytes;
  c10::DeviceIndex index;
};

void delete_nothing(void*) {}

void delete_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  account(b->index, -b->bytes);
  c10::free_cpu(b->data);
  delete b;
}

class SimAllocator final : public c10::Allocator {
 public:
  explicit SimAllocator(c10::DeviceIndex index = 0) : index_(index) {}
  void set_index(c10::DeviceIndex index) { index_ = index; }

  c10::DataPtr allocate(size_t nbytes) DIFFUSE_SIM_ALLOCATE_CONST override {
    c10::Device device(kSimType, index_);
    state().counters.at(static_cast<size_t>(index_)).allocations++;
    if (nbytes == 0) return {nullptr, nullptr, &delete_nothing, device};
    void* data = c10::alloc_cpu(nbytes);
    auto* block = new Block{data, static_cast<int64_t>(nbytes), index_};
    account(index_, block->bytes);
    return {data, block, &delete_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
#ifdef DIFFUSE_SIM_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#endif

 private:
  c10::DeviceIndex index_;
};

std::array<SimAllocator, kMaxDevices>& allocators() {
  static std::array<SimAllocator, kMaxDevices> a = [] {
    std::array<SimAllocator, kMaxDevices> v;
    for (c10::DeviceIndex i = 0; i < kMaxDevices; ++i) v[static_cast<size_t>(i)].set_index(i);
    return v;
  }();
  return a;
}

c10::DeviceIndex checked_index(c10::DeviceIndex index) {
  if (index < 0) index = tl_current_device;
  if (index >= state().count.load())
    throw std::runtime_error("simulated npu:" + std::to_string(index) + " does not exist (" +
                             std::to_string(state().count.load()) + " devices)");
  return index;
}

}  // namespace

c10::Allocator* allocator_for(c10::DeviceIndex index) {
  return &allocators().at(static_cast<size_t>(checked_index(index)));
}

namespace {

class SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kSimType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kSimType, tl_current_device); }
  void setDevice(c10::Device d) const override { tl_current_device = checked_index(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    tl_current_device = d.index() < 0 ? 0 : d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(state().count.load());
  }
};

c10::Device device_arg(const c10::IValue& v) {
  if (v.isDevice()) return v.toDevice();
  return c10::Device(kSimType, tl_current_device);
}

// empty.memory_format(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device,
//                     bool? pin_memory, MemoryFormat? memory_format) -> Tensor
void empty_memory_format(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 6);
  auto size = int_list(args[0]);
  auto dtype = args[1].isNone() ? c10::get_default_dtype_as_scalartype() : args[1].toScalarType();
  c10::optional<c10::MemoryFormat> mf;
  if (!args[5].isNone()) mf = args[5].toMemoryFormat();
  auto index = checked_index(device_arg(args[3]).index());
  at::Tensor t = at::detail::empty_generic(
      size, allocator_for(index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype, mf);
  torch::jit::push(*stack, std::move(t));
}

// empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype, Layout? layout,
//               Device? device, bool? pin_memory) -> Tensor
void empty_strided(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 6);
  auto size = int_list(args[0]);
  auto stride = int_list(args[1]);
  auto dtype = args[2].isNone() ? c10::get_default_dtype_as_scalartype() : args[2].toScalarType();
  auto index = checked_index(device_arg(args[4]).index());
  at::Tensor t =
      at::detail::empty_strided_generic(size, stride, allocator_for(index),
                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  torch::jit::push(*stack, std::move(t));
}

at::Tensor host_view(const at::Tensor& t) {
  return is_simulated(t) ? cpu_alias(t) : t;
}

// _copy_from(Tensor self, Tensor dst, bool non_blocking=False) -> Tensor: every direction
// between the CPU and the simulated device (and within it) is a CPU copy on shared memory,
// which also converts dtypes and broadcasts as copy_ must.
void copy_from(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  at::Tensor src = args[0].toTensor(), dst = args[1].toTensor();
  host_view(dst).copy_(host_view(src));
  torch::jit::push(*stack, dst);
}

// resize_(Tensor(a!) self, SymInt[] size, *, MemoryFormat? memory_format=None) -> Tensor(a!)
void resize(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  at::Tensor self = args[0].toTensor();
  c10::optional<c10::MemoryFormat> mf;
  if (!args[2].isNone()) mf = args[2].toMemoryFormat();
  resize_simulated(self, int_list(args[1]), mf);
  torch::jit::push(*stack, self);
}

// _copy_from_and_resize(Tensor self, Tensor dst) -> Tensor
void copy_from_and_resize(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 2);
  at::Tensor src = args[0].toTensor(), dst = args[1].toTensor();
  if (dst.sizes() != src.sizes()) {
    if (is_simulated(dst))
      resize_simulated(dst, src.sizes().vec(), c10::nullopt);
    else
      dst.resize_(src.sizes());
  }
  host_view(dst).copy_(host_view(src));
  torch::jit::push(*stack, dst);
}

// View kernels only compute metadata on the tensor's own storage: the CPU kernels do exactly
// that for any device, so the simulated tensor goes to them unchanged.
void metadata_on_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// _has_compatible_shallow_copy_type(Tensor self, Tensor from) -> bool. libtorch counts only
// its own dense backends as interchangeable, so Module::to(npu) (set_data) would refuse to
// move a CPU parameter; torch_npu registers this same override for PrivateUse1.
void compatible_shallow_copy_type(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 2);
  auto self = args[0].toTensor().key_set(), from = args[1].toTensor().key_set();
  auto dense = [](c10::DispatchKeySet ks) {
    return ks.has(c10::DispatchKey::Dense) &&
           ks.has_any(c10::DispatchKeySet(
               {c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit}));
  };
  torch::jit::push(*stack, self == from || (dense(self) && dense(from)));
}

const std::vector<std::string> kNativeOps = {
    "add.Tensor",
    "add_.Tensor",
    "sub.Tensor",
    "mul.Tensor",
    "mul_.Tensor",
    "div.Tensor",
    "mm",
    "bmm",
    "addmm",
    "convolution",
    "_softmax",
    "native_layer_norm",
    "native_group_norm",
    "silu",
    "gelu",
    "cat",
};

void register_kernels_once() {
  auto& s = state();
  if (s.kernels_registered) return;
  if (c10::GetAllocator(kSimType) != nullptr && c10::GetAllocator(kSimType) != &allocators()[0])
    throw std::runtime_error(
        "another PrivateUse1 backend (torch_npu?) is present; the simulated npu cannot register");
  c10::SetAllocator(kSimType, &allocators()[0]);
  static SimGuardImpl guard;
  static c10::impl::DeviceGuardImplRegistrar guard_registrar(kSimType, &guard);

  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib->impl("empty.memory_format",
            torch::CppFunction::makeFromBoxedFunction<&empty_memory_format>());
  lib->impl("empty_strided", torch::CppFunction::makeFromBoxedFunction<&empty_strided>());
  lib->impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<&copy_from>());
  lib->impl("_copy_from_and_resize",
            torch::CppFunction::makeFromBoxedFunction<&copy_from_and_resize>());
  lib->impl("resize_", torch::CppFunction::makeFromBoxedFunction<&resize>());
  for (const char* view : {"view", "as_strided", "_reshape_alias", "unfold"})
    lib->impl(view, torch::CppFunction::makeFromBoxedFunction<&metadata_on_cpu_kernel>());
  for (auto key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1}) {
    auto shallow =
        std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    shallow->impl("_has_compatible_shallow_copy_type",
                  torch::CppFunction::makeFromBoxedFunction<&compatible_shallow_copy_type>());
    s.libraries.push_back(std::move(shallow));
  }
  for (const auto& op : kNativeOps)
    lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_on_shared_memory>());
  s.libraries.push_back(std::move(lib));
  s.kernels_registered = true;
}

NpuBackend make_backend() {
  NpuBackend b;
  b.name = "simulated";
  b.simulated = true;
  b.device_count = [] { return state().count.load(); };
  b.init = [](c10::DeviceIndex index) {
    state().counters.at(static_cast<size_t>(checked_index(index))).init_calls++;
  };
  b.finalize = [] {};
  b.capabilities = [](c10::DeviceIndex) {
    std::lock_guard<std::mutex> lock(state().mu);
    return state().capabilities;
  };
  b.memory_stats = [](c10::DeviceIndex index) {
    const auto& c = state().counters.at(static_cast<size_t>(checked_index(index)));
    AllocatorStats a;
    a.allocated_bytes = a.reserved_bytes = c.allocated.load();
    a.peak_allocated_bytes = a.peak_reserved_bytes = c.peak.load();
    return a;
  };
  b.reset_peak_memory = [](c10::DeviceIndex index) {
    auto& c = state().counters.at(static_cast<size_t>(checked_index(index)));
    c.peak = c.allocated.load();
  };
  b.empty_cache = [] { state().empty_cache_calls++; };
  // There are no kernels to record: a simulated "replay" runs the call again (what a replay
  // computes, not how), so that the engine's graph path (static inputs copied in and out, one
  // capture per shape) runs on an npu device. It proves nothing about NPUGraph itself.
  b.capture_graph = [](c10::DeviceIndex index, const std::function<void()>& fn, int warmup) {
    checked_index(index);
    for (int i = 0; i <= warmup; ++i) fn();  // the warm-up, then the "captured" call
    state().graph_captures++;
    return std::function<void()>([fn] {
      state().graph_replays++;
      fn();
    });
  };
  b.manual_seed = [](c10::DeviceIndex index, uint64_t seed) {
    auto& c = state().counters.at(static_cast<size_t>(checked_index(index)));
    c.seed = seed;
    c.seeded = true;
  };
  return b;
}

}  // namespace

void register_simulated_npu(const SimulatedNpuOptions& options) {
  if (options.count < 1 || options.count > kMaxDevices)
    throw std::invalid_argument("simulated npu count must be in [1, " +
                                std::to_string(kMaxDevices) + "]");
  {
    std::lock_guard<std::mutex> lock(state().mu);
    register_kernels_once();
    state().count = options.count;
    state().capabilities = options.capabilities;
  }
  register_npu_backend(make_backend());
}

void set_simulated_capabilities(const NpuCapabilities& capabilities) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().capabilities = capabilities;
}

const std::vector<std::string>& simulated_native_ops() {
  return kNativeOps;
}

SimulatedDeviceState simulated_device_state(c10::DeviceIndex index) {
  const auto& c = state().counters.at(static_cast<size_t>(index));
  SimulatedDeviceState s;
  s.allocated_bytes = c.allocated.load();
  s.peak_allocated_bytes = c.peak.load();
  s.allocations = c.allocations.load();
  s.init_calls = c.init_calls.load();
  s.empty_cache_calls = state().empty_cache_calls.load();
  s.graph_captures = state().graph_captures.load();
  s.graph_replays = state().graph_replays.load();
  s.seeded = c.seeded.load();
  s.seed = c.seed.load();
  return s;
}

}  // namespace diffuse::device::sim
