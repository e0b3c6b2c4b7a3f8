// What every reference operator of the simulated npu needs: its boxed arguments by schema
// name, host views of simulated tensors, and the device index results go back to.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/types.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "npu_sim/sim_tensors.h"

namespace diffuse::device::sim {

// The operator's arguments, popped from the stack, looked up by their schema names.
struct ReferenceOpArgs {
  ReferenceOpArgs(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : schema(op.schema()), values(torch::jit::pop(*stack, op.schema().arguments().size())) {}
  const c10::IValue& operator[](const std::string& name) const {
    auto i = schema.argumentIndexWithName(name);
    if (!i) throw std::runtime_error("reference op: no argument " + name);
    return values[*i];
  }

  const c10::FunctionSchema& schema;
  std::vector<c10::IValue> values;
};

inline at::Tensor host(const at::Tensor& t) {
  return is_simulated(t) ? cpu_alias(t) : t;
}

inline c10::DeviceIndex index_of(const at::Tensor& t) {
  return t.device().has_index() ? t.device().index() : 0;
}

}  // namespace diffuse::device::sim
