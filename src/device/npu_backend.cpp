#include "device/npu_backend.h"

#include <memory>
#include <mutex>
#include <vector>

#include "device/cpu_fallback.h"

namespace diffuse::device {
namespace {

std::mutex& mutex() {
  static std::mutex mu;
  return mu;
}

const NpuBackend*& slot() {
  static const NpuBackend* backend = nullptr;
  return backend;
}

// Every table ever registered stays alive, so a pointer from npu_backend() never dangles even
// when a test swaps or removes the backend (a few small structs per process).
std::vector<std::unique_ptr<NpuBackend>>& all_backends() {
  static std::vector<std::unique_ptr<NpuBackend>> v;
  return v;
}

std::once_flag g_builtin_once;

}  // namespace

void register_npu_backend(NpuBackend backend) {
  {
    std::lock_guard<std::mutex> lock(mutex());
    all_backends().push_back(std::make_unique<NpuBackend>(std::move(backend)));
    slot() = all_backends().back().get();
  }
  install_cpu_fallback();
}

void unregister_npu_backend() {
  std::lock_guard<std::mutex> lock(mutex());
  slot() = nullptr;
}

const NpuBackend* npu_backend() {
  std::call_once(g_builtin_once, [] { register_builtin_npu_backend(); });
  std::lock_guard<std::mutex> lock(mutex());
  return slot();
}

int64_t npu_count() {
  const NpuBackend* b = npu_backend();
  if (!b || !b->device_count) return 0;
  try {
    return b->device_count();
  } catch (const std::exception&) {
    // A driver that fails to enumerate has no usable device; resolve_device says so.
    return 0;
  }
}

}  // namespace diffuse::device
