#include "bench/dit_block_bench.h"

#include <torch/torch.h>

#include <algorithm>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/flux_transformer.h"
#include "models/hidream_transformer.h"
#include "models/qwenimage_transformer.h"
#include "nn/attention.h"
#include "nn/flux_blocks.h"
#include "nn/hidream_blocks.h"
#include "nn/int8_linear.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "nn/rope.h"
#include "quant/quantized_weight.h"

namespace diffuse::bench {
namespace {

constexpr int64_t kVaeScale = 8;  // the Flux VAE of both families: 8x8 pixels per latent pixel

// Every parameter outside the blocks (embedders, caption projections, final layer).
double hidream_non_block_params(const models::HiDreamTransformerConfig& c) {
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

// One block of a family at full size on the bench's inputs: its image output per run.
struct BenchBlock {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor()> run;
};

// What a family gives the bench: sizes, and its two block kinds built one at a time (so that
// only one is in memory).
struct DitBenchFamily {
  int64_t num_layers = 0, num_single_layers = 0;
  int64_t pixels_per_token = 0;  // image side pixels per token (VAE factor x patch)
  double non_block_params = 0;
  int text_tokens = 0;  // as the blocks see them
  std::function<BenchBlock()> dual, single;
};

template <typename Block>
Block random_block(const std::function<Block()>& make, uint64_t seed, const torch::Device& device,
                   torch::Dtype dtype) {
  Block block{nullptr};
  {
    nn::SkipInitGuard skip(dtype);
    block = make();
  }
  nn::init_pooled_random_weights(*block, seed);
  block->to(device, dtype);
  return block;
}

DitBenchFamily hidream_family(const DitBlockBenchOptions& o, int64_t pH, int64_t pW,
                              const torch::Device& device, torch::Dtype dtype) {
  const auto config = models::HiDreamTransformerConfig::from_json(io::JsonConfig(
      models::hidream_i1_transformer_config(), "hidream-i1 transformer/config.json"));
  DitBenchFamily f;
  f.num_layers = config.num_layers;
  f.num_single_layers = config.num_single_layers;
  f.pixels_per_token = kVaeScale * config.patch_size;
  f.non_block_params = hidream_non_block_params(config);
  if (pH < 0) return f;  // sizes only
  const int64_t T = o.text_tokens > 0 ? o.text_tokens : 128, D = config.inner_dim();
  f.text_tokens = static_cast<int>(3 * T);  // T5 + last Llama layer + the block's Llama layer
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto rope = std::make_shared<nn::RopeTable>(models::hidream_image_rope(config, pH, pW, device));
  auto in = std::make_shared<nn::HiDreamBlockInputs>();
  in->adaln_input = torch::randn({o.batch, D}, opts);
  in->rope = rope.get();
  auto image = torch::randn({o.batch, pH * pW, D}, opts);
  auto text = torch::randn({o.batch, 3 * T, D}, opts);
  const auto bo = config.block_options();
  f.dual = [=] {
    auto b = random_block<nn::HiDreamImageTransformerBlock>(
        [&] { return nn::HiDreamImageTransformerBlock(bo); }, o.seed, device, dtype);
    return BenchBlock{b.ptr(), [=]() mutable { return b->forward(image, text, *in).first; }};
  };
  f.single = [=] {
    auto b = random_block<nn::HiDreamImageSingleTransformerBlock>(
        [&] { return nn::HiDreamImageSingleTransformerBlock(bo); }, o.seed + 1, device, dtype);
    auto tokens = torch::cat({image, text}, 1);
    (void)rope;  // kept alive with the closure
    return BenchBlock{b.ptr(), [=]() mutable { return b->forward(tokens, *in); }};
  };
  return f;
}

DitBenchFamily flux_family(const DitBlockBenchOptions& o, int64_t pH, int64_t pW,
                           const torch::Device& device, torch::Dtype dtype) {
  const bool dev = o.arch == "flux-dev";
  const auto c = models::FluxTransformerConfig::from_json(
      io::JsonConfig(models::flux_transformer_config(dev), o.arch + " transformer/config.json"));
  DitBenchFamily f;
  f.num_layers = c.num_layers;
  f.num_single_layers = c.num_single_layers;
  f.pixels_per_token = 2 * kVaeScale;  // 2x2 latent patches per token
  const double D = static_cast<double>(c.inner_dim());
  const double mlp = 256 * D + D + D * D + D;
  const double out = static_cast<double>(c.patch_size * c.patch_size * c.out_channels);
  f.non_block_params =
      mlp * (dev ? 2 : 1) + (static_cast<double>(c.pooled_projection_dim) * D + D + D * D + D) +
      (static_cast<double>(c.joint_attention_dim) + 1) * D +
      (static_cast<double>(c.in_channels) + 1) * D + (2 * D * D + 2 * D) + D * out + out;
  if (pH < 0) return f;
  const int64_t T = o.text_tokens > 0 ? o.text_tokens : (dev ? 512 : 256);
  f.text_tokens = static_cast<int>(T);
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto ids = torch::cat({torch::zeros({T, 3}), models::flux_image_ids(2 * pH, 2 * pW)}, 0);
  auto rope =
      std::make_shared<nn::RopeTable>(nn::rope_table(ids, c.axes_dims_rope, 10000.0, device));
  auto in = std::make_shared<nn::FluxBlockInputs>();
  in->temb = torch::randn({o.batch, c.inner_dim()}, opts);
  in->rope = rope.get();
  auto image = torch::randn({o.batch, pH * pW, c.inner_dim()}, opts);
  auto text = torch::randn({o.batch, T, c.inner_dim()}, opts);
  const auto bo = c.block_options();
  f.dual = [=] {
    auto b = random_block<nn::FluxTransformerBlock>([&] { return nn::FluxTransformerBlock(bo); },
                                                    o.seed, device, dtype);
    return BenchBlock{b.ptr(), [=]() mutable { return b->forward(image, text, *in).first; }};
  };
  f.single = [=] {
    auto b = random_block<nn::FluxSingleTransformerBlock>(
        [&] { return nn::FluxSingleTransformerBlock(bo); }, o.seed + 1, device, dtype);
    auto tokens = torch::cat({text, image}, 1);
    (void)rope;
    return BenchBlock{b.ptr(), [=]() mutable { return b->forward(tokens, *in); }};
  };
  return f;
}

// Qwen-Image: 60 double-stream blocks only (FLUX's block under Qwen's names), one image of
// true CFG per call; text = the prompt's embeddings (default 256).
DitBenchFamily qwenimage_family(const DitBlockBenchOptions& o, int64_t pH, int64_t pW,
                                const torch::Device& device, torch::Dtype dtype) {
  const auto c = models::QwenImageTransformerConfig::from_json(
      io::JsonConfig(models::qwenimage_transformer_config(), o.arch + " transformer/config.json"));
  DitBenchFamily f;
  f.num_layers = c.num_layers;
  f.num_single_layers = 0;
  f.pixels_per_token = c.patch_size * kVaeScale;
  const double D = static_cast<double>(c.inner_dim());
  const double J = static_cast<double>(c.joint_attention_dim);
  const double out = static_cast<double>(c.patch_size * c.patch_size * c.out_channels);
  f.non_block_params = (256 * D + D + D * D + D) + J + (J + 1) * D +
                       (static_cast<double>(c.in_channels) + 1) * D + (2 * D * D + 2 * D) +
                       D * out + out;
  if (pH < 0) return f;
  const int64_t T = o.text_tokens > 0 ? o.text_tokens : 256;
  f.text_tokens = static_cast<int>(T);
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto rope = std::make_shared<nn::RopeTable>(
      models::qwenimage_rope_table({{1, pH, pW}}, T, c.axes_dims_rope, device));
  auto in = std::make_shared<nn::FluxBlockInputs>();
  in->temb = torch::randn({o.batch, c.inner_dim()}, opts);
  in->rope = rope.get();
  auto image = torch::randn({o.batch, pH * pW, c.inner_dim()}, opts);
  auto text = torch::randn({o.batch, T, c.inner_dim()}, opts);
  const auto bo = c.block_options();
  f.dual = [=] {
    auto b = random_block<nn::FluxTransformerBlock>([&] { return nn::FluxTransformerBlock(bo); },
                                                    o.seed, device, dtype);
    (void)rope;  // kept alive with the closure (in->rope points into it)
    return BenchBlock{b.ptr(), [=]() mutable { return b->forward(image, text, *in).first; }};
  };
  return f;
}

DitBenchFamily dit_family(const DitBlockBenchOptions& o, int64_t pH, int64_t pW,
                          const torch::Device& device, torch::Dtype dtype) {
  if (models::is_hidream_arch(o.arch)) return hidream_family(o, pH, pW, device, dtype);
  if (models::is_flux_arch(o.arch)) return flux_family(o, pH, pW, device, dtype);
  if (models::is_qwenimage_arch(o.arch)) return qwenimage_family(o, pH, pW, device, dtype);
  throw InvalidArgument("unknown DiT arch '" + o.arch +
                        "' (expected hidream-i1, flux-dev, flux-schnell or qwen-image)");
}

}  // namespace

DitBlockBenchResult run_dit_block_bench(const DitBlockBenchOptions& o) {
  if (o.batch < 1) throw InvalidArgument("--batch must be >= 1, got " + std::to_string(o.batch));
  if (o.repeat < 1) throw InvalidArgument("--steps must be >= 1, got " + std::to_string(o.repeat));
  if (o.text_tokens < 0 || o.text_tokens > 4096)
    throw InvalidArgument("text tokens must be in 0..4096, got " + std::to_string(o.text_tokens));
  const auto sizes = dit_family(o, -1, -1, torch::kCPU, torch::kFloat32);
  const int64_t patch_px = sizes.pixels_per_token;
  if (o.width <= 0 || o.height <= 0 || o.width % patch_px != 0 || o.height % patch_px != 0)
    throw InvalidArgument("--width/--height must be positive multiples of " +
                          std::to_string(patch_px) + ", got " + std::to_string(o.width) + "x" +
                          std::to_string(o.height));
  const auto weight_type = quant::parse_weight_type(o.weights, "--weights");
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "transformer");
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env(o.attention, device));

  DitBlockBenchResult r;
  r.arch = o.arch;
  r.device = device.str();
  r.dtype = c10::toString(dtype);
  r.attention = nn::attention_backend_name(nn::default_attention_backend());
  r.width = o.width;
  r.height = o.height;
  r.batch = o.batch;
  r.threads = at::get_num_threads();
  const int64_t pH = o.height / patch_px, pW = o.width / patch_px;
  r.image_tokens = static_cast<int>(pH * pW);

  if (o.roofline) {
    if (o.log) o.log("measuring the roofline ...");
    r.roofline = measure_roofline(device, dtype, /*channels_last=*/false);
  }
  const double roof = r.roofline ? r.roofline->matmul_gflops : 0.0;

  torch::manual_seed(o.seed);
  const auto f = dit_family(o, pH, pW, device, dtype);
  r.num_layers = static_cast<int>(f.num_layers);
  r.num_single_layers = static_cast<int>(f.num_single_layers);
  r.text_tokens = f.text_tokens;
  double overall_peak = 0;
  const auto time_kind = [&](const std::function<BenchBlock()>& make, const std::string& name,
                             BlockTiming& timing, std::optional<QuantizedBlockTiming>& quantized) {
    if (!make) return;  // a family without blocks of this kind (Qwen-Image: no single-stream)
    auto block = make();
    torch::Tensor plain;
    timing = time_block(*block.module, device, o.repeat, roof, &overall_peak, name, o.log,
                        [&] { plain = block.run(); });
    if (!weight_type) return;
    quantized = time_quantized(*block.module, *weight_type, plain, device, o.repeat, roof,
                               &overall_peak, name + " " + o.weights, o.log, block.run);
    // The same work as the plain block: an integer GEMM runs outside LibTorch's operators, which
    // the FLOP counter sees.
    quantized->timing.flops = timing.flops;
    if (roof > 0)
      quantized->timing.roofline_fraction =
          (timing.flops.total() / 1e9 / roof) / quantized->timing.best_s;
    quantized->integer_products = *weight_type == quant::GgmlType::I8_ROWS && device.is_cpu() &&
                                  (dtype == torch::kFloat || dtype == torch::kBFloat16) &&
                                  nn::int8_gemm_available();
  };
  time_kind(f.dual, "dual-stream block", r.dual, r.dual_quantized);
  time_kind(f.single, "single-stream block", r.single, r.single_quantized);
  r.step_estimate_s = f.num_layers * r.dual.best_s + f.num_single_layers * r.single.best_s;
  const double params = f.num_layers * r.dual.params_m * 1e6 +
                        f.num_single_layers * r.single.params_m * 1e6 + f.non_block_params;
  r.transformer_params_b = params / 1e9;
  r.transformer_gib =
      params * static_cast<double>(c10::elementSize(dtype)) / (1024.0 * 1024.0 * 1024.0);
  r.weights = o.weights;
  if (r.dual_quantized && (r.single_quantized || f.num_single_layers == 0)) {
    const auto& dq = *r.dual_quantized;
    const QuantizedBlockTiming none;
    const auto& sq = r.single_quantized ? *r.single_quantized : none;
    r.step_estimate_quantized_s =
        f.num_layers * dq.timing.best_s + f.num_single_layers * sq.timing.best_s;
    const double block_mb =
        f.num_layers * dq.block_quantized_mb + f.num_single_layers * sq.block_quantized_mb;
    r.transformer_quantized_gib =
        block_mb / 1024.0 + f.non_block_params * static_cast<double>(c10::elementSize(dtype)) /
                                (1024.0 * 1024.0 * 1024.0);
  }
  return r;
}

nlohmann::json to_json(const DitBlockBenchResult& r) {
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
  nlohmann::json j = {{"arch", r.arch},
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
  if (r.dual_quantized) {
    auto quantized = [&](const QuantizedBlockTiming& q) {
      auto b = block(q.timing);
      b["linear_plain_mb"] = q.plain_mb;
      b["linear_quantized_mb"] = q.quantized_mb;
      b["block_plain_mb"] = q.block_plain_mb;
      b["block_quantized_mb"] = q.block_quantized_mb;
      b["relative_error"] = q.relative_error;
      b["dequantize_s"] = q.dequantize_s;
      b["integer_products"] = q.integer_products;
      return b;
    };
    j["weights"] = r.weights;
    j["dual_block_quantized"] = quantized(*r.dual_quantized);
    if (r.single_quantized) j["single_block_quantized"] = quantized(*r.single_quantized);
    j["step_estimate_quantized_s"] = r.step_estimate_quantized_s;
    j["transformer_quantized_gib"] = r.transformer_quantized_gib;
  }
  return j;
}

}  // namespace diffuse::bench
