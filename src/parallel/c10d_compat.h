// The c10d pieces diffuse uses, across libtorch versions. Internal to src/parallel.
//
// libtorch 1.13: every backend (ProcessGroupGloo, ProcessGroupNCCL) *is* a c10d::ProcessGroup.
// libtorch 2.x: backends derive from c10d::Backend and a c10d::ProcessGroup wraps them. Both
// expose the same allgather(outputs, inputs, options) -> Work, so diffuse holds the backend
// itself through compat::Backend and never needs the 2.x wrapper.
#pragma once
#include <torch/version.h>

// ProcessGroupGloo.hpp compiles only with USE_C10D_GLOO, which LibTorch's own build defines
// but its CMake package does not export; its headers need Gloo's (Debian: libgloo-dev).
#if !defined(USE_C10D_GLOO) && __has_include(<gloo/transport/device.h>)
#define USE_C10D_GLOO 1
#endif
#if defined(DIFFUSE_WITH_CUDA) && !defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define USE_C10D_NCCL 1
#endif

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
// PyTorch's pip wheels define USE_C10D_GLOO in their CMake package but ship no Gloo headers:
// Gloo is used only where its headers are there too.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define DIFFUSE_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
// Likewise NCCL: a CUDA wheel may define USE_C10D_NCCL while nccl.h lives in a pip package
// outside the include path.
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define DIFFUSE_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if defined(DIFFUSE_WITH_TORCH_NPU) && !defined(DIFFUSE_WITHOUT_HCCL) && \
    __has_include(<torch_npu/csrc/distributed/ProcessGroupHCCL.hpp>)
#include <torch_npu/csrc/distributed/ProcessGroupHCCL.hpp>
#define DIFFUSE_HAVE_HCCL 1
#endif

namespace diffuse::parallel::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = ::c10d::Backend;
#else
using Backend = ::c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<Backend>;

}  // namespace diffuse::parallel::compat
