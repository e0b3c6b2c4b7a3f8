#include "nn/npu_op_call.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <stdexcept>

namespace diffuse::nn {

c10::optional<c10::OperatorHandle> find_npu_op(const char* qualified_name) {
  auto op = c10::Dispatcher::singleton().findSchema({qualified_name, ""});
  if (op && !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return c10::nullopt;
  return op;
}

bool schema_has_argument(const c10::OperatorHandle& op, const std::string& argument) {
  for (const auto& arg : op.schema().arguments())
    if (arg.name() == argument) return true;
  return false;
}

torch::jit::Stack call_npu_op_by_name(const c10::OperatorHandle& op,
                                      const std::map<std::string, c10::IValue>& named) {
  const auto& schema = op.schema();
  torch::jit::Stack stack;
  size_t used = 0;
  for (const auto& arg : schema.arguments()) {
    auto it = named.find(arg.name());
    if (it != named.end()) {
      stack.push_back(it->second);
      ++used;
    } else if (arg.default_value()) {
      stack.push_back(*arg.default_value());
    } else {
      throw std::runtime_error(std::string(schema.name()) + ": argument '" + arg.name() +
                               "' has no default and is unknown to diffuse");
    }
  }
  if (used != named.size())
    throw std::runtime_error(std::string(schema.name()) +
                             " lacks an argument diffuse passes (schema: " + c10::toString(schema) +
                             ")");
  // Inference only: skip autograd, which torch_npu does not register for every fused operator.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.callBoxed(&stack);
  return stack;
}

}  // namespace diffuse::nn
