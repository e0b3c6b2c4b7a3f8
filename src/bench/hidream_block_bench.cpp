#include "bench/hidream_block_bench.h"

#include <torch/torch.h>

#include <algorithm>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/hidream_transformer.h"
#include "nn/attention.h"
#include "nn/hidream_blocks.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "nn/rope.h"
#include "quant/quantized_weight.h"

namespace diffuse::bench {
namespace {

constexpr int64_t kVaeScale = 8;  // HiDream's Flux VAE: 8x8 pixels per latent pixel

// Every parameter outside the blocks (embedders, caption projections, final layer).
double non_block_params(const models::HiDreamTransformerConfig& c) {
  const double D = static_cast<double>(c.inner_dim());
  const double blocks = static_cast<double>(c.num_layers + c.num_single_layers);
  const double patch = static_cast<double>(c.patch_size * c.patch_size);
  const double t_emb = 256 * D + D + D * D + D;
  const double p_emb = static_cast<double>(c.text_emb_dim) * D + D + D * D + D;
  const double x_emb = patch * static_cast<double>(c.in_channels) * D + D;
  const double captions = (blocks * static_cast<double>(c.caption_channels[1]) +
                           static_cast<double>(c.caption_channels[0])) *
                          D;
  const double out = patch * static_cast<double>(c.out_channels);
  const double final_layer = D * 2 * D + 2 * D + D * out + out;
  return t_emb + p_emb + x_emb + captions + final_layer;
}

template <typename Fn>
BlockTiming time_block(torch::nn::Module& block, const torch::Device& device, int repeat,
                       double matmul_gflops, double* overall_peak, const std::string& name,
                       const std::function<void(const std::string&)>& log, Fn&& run) {
  BlockTiming t;
  t.params_m = params_m(block);
  StagePeak peak(overall_peak, device);
  double t0 = now_s();
  {
    FlopCounter counter;  // the warm-up run also counts the FLOPs
    run();
    sync_device(device);
    t.flops = counter.counts();
  }
  if (log) log(name + " warm-up: " + fmt("%.3f s", now_s() - t0));
  double sum = 0;
  t.best_s = 1e30;
  for (int i = 0; i < repeat; ++i) {
    t0 = now_s();
    run();
    sync_device(device);
    const double dt = now_s() - t0;
    sum += dt;
    t.best_s = std::min(t.best_s, dt);
    if (log) log(name + " run " + std::to_string(i + 1) + ": " + fmt("%.3f s", dt));
  }
  t.mean_s = sum / repeat;
  t.peak_mb = peak.finish();
  t.device_peak_mb = peak.device_peak_mb();
  if (matmul_gflops > 0) t.roofline_fraction = (t.flops.total() / 1e9 / matmul_gflops) / t.best_s;
  return t;
}

double block_weight_mb(const torch::nn::Module& block) {
  return static_cast<double>(nn::resident_parameter_bytes(block)) / (1024.0 * 1024.0);
}

// Quantizes `block`'s linear layers and times it again; `plain_out` is its plain output.
template <typename Fn>
QuantizedBlockTiming time_quantized(torch::nn::Module& block, quant::GgmlType type,
                                    const torch::Tensor& plain_out, const torch::Device& device,
                                    int repeat, double matmul_gflops, double* overall_peak,
                                    const std::string& name,
                                    const std::function<void(const std::string&)>& log, Fn&& run) {
  QuantizedBlockTiming q;
  q.block_plain_mb = block_weight_mb(block);
  const auto layers = nn::quantize_linear_layers(block, type);
  q.plain_mb = static_cast<double>(layers.plain_bytes) / (1024.0 * 1024.0);
  q.quantized_mb = static_cast<double>(layers.quantized_bytes) / (1024.0 * 1024.0);
  q.block_quantized_mb = block_weight_mb(block);
  torch::Tensor out;
  q.timing = time_block(block, device, repeat, matmul_gflops, overall_peak, name, log,
                        [&] { out = run(); });
  q.dequantize_s = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const double t0 = now_s();
    for (const auto& m : block.modules())
      if (const auto* lin = dynamic_cast<const nn::LinearImpl*>(m.get()); lin && lin->quantized)
        quant::dequantize_weight(*lin->quantized, lin->weight.scalar_type());
    sync_device(device);
    q.dequantize_s = std::min(q.dequantize_s, now_s() - t0);
  }
  const auto diff = (out.to(torch::kFloat64) - plain_out.to(torch::kFloat64)).norm();
  q.relative_error = (diff / plain_out.to(torch::kFloat64).norm()).item<double>();
  return q;
}

}  // namespace

HiDreamBlockBenchResult run_hidream_block_bench(const HiDreamBlockBenchOptions& o) {
  if (o.batch < 1) throw InvalidArgument("--batch must be >= 1, got " + std::to_string(o.batch));
  if (o.repeat < 1) throw InvalidArgument("--steps must be >= 1, got " + std::to_string(o.repeat));
  const auto config = models::HiDreamTransformerConfig::from_json(io::JsonConfig(
      models::hidream_i1_transformer_config(), "hidream-i1 transformer/config.json"));
  const int64_t patch_px = kVaeScale * config.patch_size;
  if (o.width <= 0 || o.height <= 0 || o.width % patch_px != 0 || o.height % patch_px != 0)
    throw InvalidArgument("--width/--height must be positive multiples of " +
                          std::to_string(patch_px) + ", got " + std::to_string(o.width) + "x" +
                          std::to_string(o.height));
  const auto weight_type = quant::parse_weight_type(o.weights, "--weights");
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::keep_freed_memory();
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "transformer");
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env(o.attention, device));

  HiDreamBlockBenchResult r;
  r.device = device.str();
  r.dtype = c10::toString(dtype);
  r.attention = nn::attention_backend_name(nn::default_attention_backend());
  r.width = o.width;
  r.height = o.height;
  r.batch = o.batch;
  r.threads = at::get_num_threads();
  r.num_layers = static_cast<int>(config.num_layers);
  r.num_single_layers = static_cast<int>(config.num_single_layers);
  const int64_t pH = o.height / patch_px, pW = o.width / patch_px, D = config.inner_dim();
  const int64_t T = o.text_tokens;
  r.image_tokens = static_cast<int>(pH * pW);
  r.text_tokens = static_cast<int>(3 * T);  // T5 + last Llama layer + the block's Llama layer

  if (o.roofline) {
    if (o.log) o.log("measuring the roofline ...");
    r.roofline = measure_roofline(device, dtype, /*channels_last=*/false);
  }
  const double roof = r.roofline ? r.roofline->matmul_gflops : 0.0;

  const auto bo = config.block_options();
  torch::manual_seed(o.seed);
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  const auto rope = models::hidream_image_rope(config, pH, pW, device);
  nn::HiDreamBlockInputs in;
  in.adaln_input = torch::randn({o.batch, D}, opts);
  in.rope = &rope;
  auto image = torch::randn({o.batch, pH * pW, D}, opts);
  auto text = torch::randn({o.batch, 3 * T, D}, opts);
  double overall_peak = 0;
  {
    nn::HiDreamImageTransformerBlock block{nullptr};
    {
      nn::SkipInitGuard skip(dtype);
      block = nn::HiDreamImageTransformerBlock(bo);
    }
    nn::init_pooled_random_weights(*block, o.seed);
    block->to(device, dtype);
    torch::Tensor plain;
    r.dual = time_block(*block, device, o.repeat, roof, &overall_peak, "dual-stream block", o.log,
                        [&] { plain = block->forward(image, text, in).first; });
    if (weight_type)
      r.dual_quantized = time_quantized(*block, *weight_type, plain, device, o.repeat, roof,
                                        &overall_peak, "dual-stream block " + o.weights, o.log,
                                        [&] { return block->forward(image, text, in).first; });
  }
  {
    nn::HiDreamImageSingleTransformerBlock block{nullptr};
    {
      nn::SkipInitGuard skip(dtype);
      block = nn::HiDreamImageSingleTransformerBlock(bo);
    }
    nn::init_pooled_random_weights(*block, o.seed + 1);
    block->to(device, dtype);
    auto tokens = torch::cat({image, text}, 1);
    torch::Tensor plain;
    r.single = time_block(*block, device, o.repeat, roof, &overall_peak, "single-stream block",
                          o.log, [&] { plain = block->forward(tokens, in); });
    if (weight_type)
      r.single_quantized = time_quantized(*block, *weight_type, plain, device, o.repeat, roof,
                                          &overall_peak, "single-stream block " + o.weights, o.log,
                                          [&] { return block->forward(tokens, in); });
  }
  r.step_estimate_s =
      config.num_layers * r.dual.best_s + config.num_single_layers * r.single.best_s;
  const double params = config.num_layers * r.dual.params_m * 1e6 +
                        config.num_single_layers * r.single.params_m * 1e6 +
                        non_block_params(config);
  r.transformer_params_b = params / 1e9;
  r.transformer_gib =
      params * static_cast<double>(c10::elementSize(dtype)) / (1024.0 * 1024.0 * 1024.0);
  r.weights = o.weights;
  if (r.dual_quantized && r.single_quantized) {
    const auto& dq = *r.dual_quantized;
    const auto& sq = *r.single_quantized;
    r.step_estimate_quantized_s =
        config.num_layers * dq.timing.best_s + config.num_single_layers * sq.timing.best_s;
    const double block_mb = config.num_layers * dq.block_quantized_mb +
                            config.num_single_layers * sq.block_quantized_mb;
    r.transformer_quantized_gib =
        block_mb / 1024.0 + non_block_params(config) *
                                static_cast<double>(c10::elementSize(dtype)) /
                                (1024.0 * 1024.0 * 1024.0);
  }
  return r;
}

nlohmann::json to_json(const HiDreamBlockBenchResult& r) {
  auto block = [](const BlockTiming& t) {
    return nlohmann::json{{"params_m", t.params_m},
                          {"best_s", t.best_s},
                          {"mean_s", t.mean_s},
                          {"gflop", t.flops.total() / 1e9},
                          {"gflop_attention", t.flops.attention / 1e9},
                          {"peak_mb", t.peak_mb},
                          {"device_peak_mb", t.device_peak_mb},
                          {"roofline_fraction", t.roofline_fraction}};
  };
  nlohmann::json j = {{"arch", "hidream-i1"},
                      {"device", r.device},
                      {"dtype", r.dtype},
                      {"attention", r.attention},
                      {"width", r.width},
                      {"height", r.height},
                      {"batch", r.batch},
                      {"threads", r.threads},
                      {"image_tokens", r.image_tokens},
                      {"text_tokens", r.text_tokens},
                      {"dual_block", block(r.dual)},
                      {"single_block", block(r.single)},
                      {"num_layers", r.num_layers},
                      {"num_single_layers", r.num_single_layers},
                      {"step_estimate_s", r.step_estimate_s},
                      {"transformer_params_b", r.transformer_params_b},
                      {"transformer_gib", r.transformer_gib}};
  if (r.roofline) j["roofline_matmul_gflops"] = r.roofline->matmul_gflops;
  if (r.dual_quantized && r.single_quantized) {
    auto quantized = [&](const QuantizedBlockTiming& q) {
      auto b = block(q.timing);
      b["linear_plain_mb"] = q.plain_mb;
      b["linear_quantized_mb"] = q.quantized_mb;
      b["block_plain_mb"] = q.block_plain_mb;
      b["block_quantized_mb"] = q.block_quantized_mb;
      b["relative_error"] = q.relative_error;
      b["dequantize_s"] = q.dequantize_s;
      return b;
    };
    j["weights"] = r.weights;
    j["dual_block_quantized"] = quantized(*r.dual_quantized);
    j["single_block_quantized"] = quantized(*r.single_quantized);
    j["step_estimate_quantized_s"] = r.step_estimate_quantized_s;
    j["transformer_quantized_gib"] = r.transformer_quantized_gib;
  }
  return j;
}

}  // namespace diffuse::bench
