// Calling torch_npu operators through the dispatcher by schema name, so diffuse compiles and
// links without torch_npu and keeps working across its releases (which append arguments to
// the fused operators). Shared by the fused attention and the fused HiDream pieces.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <map>
#include <string>

namespace diffuse::nn {

// The operator `qualified_name` ("npu::npu_rms_norm") if it is registered with a kernel for
// the npu (PrivateUse1) device, else nullopt.
c10::optional<c10::OperatorHandle> find_npu_op(const char* qualified_name);

bool schema_has_argument(const c10::OperatorHandle& op, const std::string& argument);

// Calls `op` with the arguments named in `named`; every other argument takes its schema
// default. std::runtime_error if an argument without a default is not given or a given one
// is not in the schema. Runs below autograd (inference kernels).
torch::jit::Stack call_npu_op_by_name(const c10::OperatorHandle& op,
                                      const std::map<std::string, c10::IValue>& named);

}  // namespace diffuse::nn
