// Reference versions of torch_npu's fused attention operators for the simulated npu: the real
// names and schemas (op-plugin's op_plugin_functions.yaml), a plain float32 computation.
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "npu_sim/reference_op_args.h"
#include "npu_sim/sim_tensors.h"
#include "npu_sim/simulated_npu.h"

namespace diffuse::device::sim {
namespace {

const char* kFusionSchema =
    "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
    "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float "
    "keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? "
    "prefix=None, "
    "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool "
    "gen_mask_parallel=True, "
    "bool sync=False, str softmax_layout=\"\", Tensor? sink=None, Tensor? dropout_mask=None, int "
    "seed=0, "
    "int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)";

const char* kPromptFlashSchema =
    "npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? "
    "padding_mask=None, "
    "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? "
    "deq_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, Tensor? "
    "quant_offset2=None, "
    "int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, int next_tokens=0, "
    "str input_layout=\"BSH\", int num_key_value_heads=0, int[]? actual_seq_lengths_kv=None, "
    "int sparse_mode=0) -> Tensor";

std::mutex g_calls_mu;
std::vector<FusedAttentionCall> g_calls;
std::atomic<bool> g_fail{false};

// -> [B, N, S, D] and the function that restores the input layout.
at::Tensor to_bnsd(const at::Tensor& x, const std::string& layout, int64_t heads) {
  if (layout == "BNSD") return x;
  if (layout == "BSND") return x.permute({0, 2, 1, 3});
  if (layout == "BSH")
    return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).permute({0, 2, 1, 3});
  if (layout == "SBH")
    return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).permute({1, 2, 0, 3});
  throw std::runtime_error("reference op: layout " + layout + " is not modelled");
}

at::Tensor from_bnsd(const at::Tensor& x, const std::string& layout) {
  if (layout == "BNSD") return x.contiguous();
  if (layout == "BSND") return x.permute({0, 2, 1, 3}).contiguous();
  if (layout == "BSH") return x.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(2), -1});
  return x.permute({2, 0, 1, 3}).reshape({x.size(2), x.size(0), -1});  // SBH
}

// softmax(scale * q k^T, masked) v in float32. A position takes part when the mask (true =
// masked out) allows it and it lies in the [-pre, +next] token window. The window is applied
// even without a mask, which is stricter than the documentation of the newest CANN releases
// (they ignore the window then) and catches a call that relies on that.
// The kernel's result computed plainly in float32, a block of query rows at a time: a whole
// score matrix of a VAE's mid-block attention (16k tokens) would take a GiB per call, and the
// page faults of touching it cost the simulated-device tests most of their time.
at::Tensor reference(const at::Tensor& q4, const at::Tensor& k4, const at::Tensor& v4, double scale,
                     const c10::IValue& mask, int64_t pre, int64_t next) {
  auto q = q4.to(torch::kFloat32), k = k4.to(torch::kFloat32), v = v4.to(torch::kFloat32);
  const int64_t sq = q.size(2), sk = k.size(2);
  at::Tensor refused;  // true where the mask takes a key away
  if (!mask.isNone()) refused = host(mask.toTensor()).to(torch::kBool);
  const auto kt = k.transpose(-1, -2);
  const int64_t score_bytes_per_row = q.size(0) * q.size(1) * sk * 4;
  const int64_t rows =
      std::max<int64_t>(1, (int64_t{32} << 20) / std::max<int64_t>(1, score_bytes_per_row));
  std::vector<at::Tensor> out;
  for (int64_t r0 = 0; r0 < sq; r0 += rows) {
    const int64_t n = std::min(rows, sq - r0);
    auto scores = torch::matmul(q.narrow(2, r0, n), kt) * scale;
    auto i = torch::arange(r0, r0 + n, torch::kInt64).unsqueeze(1),
         j = torch::arange(sk, torch::kInt64).unsqueeze(0);
    auto allowed = ((j - i) <= next).logical_and((i - j) <= pre);
    if (refused.defined()) {
      // A mask of one row (or none along the queries) applies to every row.
      const auto m =
          refused.dim() >= 2 && refused.size(-2) == sq ? refused.narrow(-2, r0, n) : refused;
      allowed = allowed.logical_and(m.logical_not());
    }
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    out.push_back(torch::matmul(scores.softmax(-1), v));
  }
  return torch::cat(out, 2).to(q4.scalar_type());
}

void record(const std::string& op, const std::string& layout, int64_t heads, double scale,
            bool mask, int64_t pre, int64_t next, const at::Tensor& q) {
  {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    g_calls.push_back({op, layout, heads, scale, mask, pre, next, c10::toString(q.scalar_type())});
  }
  if (g_fail) throw std::runtime_error(op + ": simulated kernel failure");
}

void fusion_attention(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ReferenceOpArgs a(op, stack);
  at::Tensor q = a["query"].toTensor(), k = a["key"].toTensor(), v = a["value"].toTensor();
  auto dtype = q.scalar_type();
  if (dtype != torch::kFloat16 && dtype != torch::kBFloat16 && dtype != torch::kFloat32)
    throw std::runtime_error("npu_fusion_attention: unsupported dtype");
  std::string layout = a["input_layout"].toStringRef();
  int64_t heads = a["head_num"].toInt();
  double scale = a["scale"].toDouble();
  int64_t pre = a["pre_tockens"].toInt(), next = a["next_tockens"].toInt();
  record("npu_fusion_attention", layout, heads, scale, !a["atten_mask"].isNone(), pre, next, q);
  auto out = reference(to_bnsd(host(q), layout, heads), to_bnsd(host(k), layout, heads),
                       to_bnsd(host(v), layout, heads), scale, a["atten_mask"], pre, next);
  out = from_bnsd(out, layout);
  // Softmax statistics and the reserved output: garbage, so taking them is caught.
  auto stats = torch::full({q.size(0), heads, out.size(-2), 8}, std::nanf(""), torch::kFloat32);
  auto idx = index_of(q);
  torch::jit::push(*stack, wrap_as_simulated(out, idx), wrap_as_simulated(stats, idx),
                   wrap_as_simulated(stats, idx),
                   wrap_as_simulated(torch::full({1}, std::nanf("")), idx), int64_t(0), int64_t(0),
                   int64_t(0));
}

void prompt_flash_attention(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ReferenceOpArgs a(op, stack);
  at::Tensor q = a["query"].toTensor(), k = a["key"].toTensor(), v = a["value"].toTensor();
  auto dtype = q.scalar_type();
  if (dtype != torch::kFloat16 && dtype != torch::kBFloat16)
    throw std::runtime_error("npu_prompt_flash_attention: float16/bfloat16 only");
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous())
    throw std::runtime_error("npu_prompt_flash_attention: non-contiguous inputs are not supported");
  std::string layout = a["input_layout"].toStringRef();
  int64_t heads = a["num_heads"].toInt();
  double scale = a["scale_value"].toDouble();
  int64_t pre = a["pre_tokens"].toInt(), next = a["next_tokens"].toInt();
  record("npu_prompt_flash_attention", layout, heads, scale, !a["atten_mask"].isNone(), pre, next,
         q);
  auto out = reference(to_bnsd(host(q), layout, heads), to_bnsd(host(k), layout, heads),
                       to_bnsd(host(v), layout, heads), scale, a["atten_mask"], pre, next);
  torch::jit::push(*stack, wrap_as_simulated(from_bnsd(out, layout), index_of(q)));
}

}  // namespace

void register_reference_npu_attention_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto def = std::make_unique<torch::Library>(torch::Library::DEF, "npu", c10::nullopt,
                                                       __FILE__, __LINE__);
    def->def(kFusionSchema);
    def->def(kPromptFlashSchema);
    static auto impl = std::make_unique<torch::Library>(
        torch::Library::IMPL, "npu", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    impl->impl("npu_fusion_attention",
               torch::CppFunction::makeFromBoxedFunction<&fusion_attention>());
    impl->impl("npu_prompt_flash_attention",
               torch::CppFunction::makeFromBoxedFunction<&prompt_flash_attention>());
  });
}

void set_reference_ops_fail(bool fail) {
  g_fail = fail;
}

std::vector<FusedAttentionCall> fused_attention_calls() {
  std::lock_guard<std::mutex> lock(g_calls_mu);
  return g_calls;
}

void reset_fused_attention_calls() {
  std::lock_guard<std::mutex> lock(g_calls_mu);
  g_calls.clear();
}

}  // namespace diffuse::device::sim
