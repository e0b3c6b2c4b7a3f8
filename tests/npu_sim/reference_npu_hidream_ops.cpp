// Reference versions of the torch_npu operators diffuse calls for HiDream's transformer, under
// their real names and schemas (Ascend/op-plugin op_plugin_functions.yaml), computed plainly in
// float32 on the host: npu_rms_norm, npu_rotary_mul (half and interleave modes),
// npu_grouped_matmul (one tensor per group, split_item 0). Modes diffuse does not use throw,
// so a call relying on them fails the tests.
#include <torch/library.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "npu_sim/reference_op_args.h"
#include "npu_sim/sim_tensors.h"
#include "npu_sim/simulated_npu.h"

namespace diffuse::device::sim {
namespace {

const char* kRmsNormSchema =
    "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)";
const char* kRotaryMulSchema =
    "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor";
const char* kGroupedMatmulSchema =
    "npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? "
    "scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? "
    "antiquant_offset=None, Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? "
    "activation_input=None, Tensor[]? activation_quant_scale=None, Tensor[]? "
    "activation_quant_offset=None, int? split_item=0, int? group_type=None, int? "
    "group_list_type=0, int? act_type=0, int[]? tuning_config=None, ScalarType? "
    "output_dtype=None) -> Tensor[]";

std::mutex g_counts_mu;
std::map<std::string, int64_t> g_counts;

void count(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  ++g_counts[op];
}

void rms_norm(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ReferenceOpArgs a(op, stack);
  auto x = host(a["self"].toTensor()), gamma = host(a["gamma"].toTensor());
  if (gamma.scalar_type() != x.scalar_type())
    throw std::runtime_error("npu_rms_norm: gamma must have the dtype of self");
  count("npu_rms_norm");
  auto xf = x.to(torch::kFloat32);
  auto rstd = torch::rsqrt(xf.pow(2).mean(-1, true) + a["epsilon"].toDouble());
  auto y = (xf * rstd * gamma.to(torch::kFloat32)).to(x.scalar_type());
  const auto idx = index_of(a["self"].toTensor());
  torch::jit::push(*stack, wrap_as_simulated(y, idx), wrap_as_simulated(rstd, idx));
}

void rotary_mul(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ReferenceOpArgs a(op, stack);
  auto x = host(a["self"].toTensor()).to(torch::kFloat32);
  auto r1 = host(a["r1"].toTensor()).to(torch::kFloat32);
  auto r2 = host(a["r2"].toTensor()).to(torch::kFloat32);
  const std::string mode = a["rotary_mode"].toStringRef();
  count("npu_rotary_mul:" + mode);
  torch::Tensor rotated;
  if (mode == "interleave") {  // (x0, x1) -> (-x1, x0) per adjacent pair
    auto pairs = x.unflatten(-1, {x.size(-1) / 2, 2});
    rotated = torch::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  } else if (mode == "half") {  // (x_lo, x_hi) -> (-x_hi, x_lo)
    auto halves = x.chunk(2, -1);
    rotated = torch::cat({-halves[1], halves[0]}, -1);
  } else {
    throw std::runtime_error("npu_rotary_mul: unknown rotary_mode " + mode);
  }
  auto y = (x * r1 + rotated * r2).to(a["self"].toTensor().scalar_type());
  torch::jit::push(*stack, wrap_as_simulated(y, index_of(a["self"].toTensor())));
}

void grouped_matmul(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ReferenceOpArgs a(op, stack);
  if (a["group_type"].isNone())
    throw std::runtime_error("npu_grouped_matmul: Requires manual passing group_type");
  if (a["group_type"].toInt() != -1 || !a["group_list"].isNone() || !a["bias"].isNone() ||
      a["split_item"].toInt() != 0)
    throw std::runtime_error("npu_grouped_matmul: only split_item 0 without grouping is modelled");
  auto xs = a["x"].toTensorList().vec(), ws = a["weight"].toTensorList().vec();
  if (xs.size() != ws.size())
    throw std::runtime_error("npu_grouped_matmul: x/weight counts differ");
  count("npu_grouped_matmul");
  c10::List<at::Tensor> out;
  for (size_t i = 0; i < xs.size(); ++i) {
    auto y = torch::matmul(host(xs[i]).to(torch::kFloat32), host(ws[i]).to(torch::kFloat32));
    out.push_back(wrap_as_simulated(y.to(xs[i].scalar_type()), index_of(xs[i])));
  }
  torch::jit::push(*stack, out);
}

}  // namespace

void register_reference_npu_hidream_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto def = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "npu",
                                                       c10::nullopt, __FILE__, __LINE__);
    def->def(kRmsNormSchema);
    def->def(kRotaryMulSchema);
    def->def(kGroupedMatmulSchema);
    static auto impl = std::make_unique<torch::Library>(
        torch::Library::IMPL, "npu", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    impl->impl("npu_rms_norm", torch::CppFunction::makeFromBoxedFunction<&rms_norm>());
    impl->impl("npu_rotary_mul", torch::CppFunction::makeFromBoxedFunction<&rotary_mul>());
    impl->impl("npu_grouped_matmul", torch::CppFunction::makeFromBoxedFunction<&grouped_matmul>());
  });
}

int64_t reference_op_calls(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  auto it = g_counts.find(op);
  return it == g_counts.end() ? 0 : it->second;
}

void reset_reference_op_calls() {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  g_counts.clear();
}

}  // namespace diffuse::device::sim
