#include "bench/pipeline_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "bench/bench_util.h"
#include "bench/memory_probe.h"
#include "bench/unet_inputs.h"
#include "device/cpu_allocator.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/device_graph.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "models/autoencoder_kl.h"
#include "models/builtin_configs.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/load_weights.h"
#include "nn/random_init.h"
#include "pipeline/model_source.h"
#include "pipeline/step_work.h"
#include "quant/quantized_weight.h"

namespace diffuse::bench {
namespace {

// Configs and (for a real model) weights of the three networks.
struct Source {
  io::JsonConfig unet, vae, text_encoder;
  std::optional<io::JsonConfig> text_encoder_2;  // SDXL's CLIP-G
  std::optional<pipeline::ModelSource> model;
};

Source open_source(const PipelineBenchOptions& o) {
  Source s;
  if (!o.model.empty()) {
    s.model = pipeline::open_model_source(o.model, {});
    if (s.model->unet_file)
      throw InvalidArgument(o.model +
                            ": a GGUF checkpoint's UNet loads quantized, which this bench does "
                            "not build; time it with txt2img --json, or bench the model's "
                            "safetensors form with --weights q8_0");
    s.unet = s.model->unet_config;
    s.vae = s.model->vae_config;
    s.text_encoder = s.model->text_encoders.front().config;
    if (s.model->text_encoders.size() > 1) s.text_encoder_2 = s.model->text_encoders[1].config;
    return s;
  }
  const models::ArchConfigs& a = models::builtin_arch(o.arch);
  s.unet = io::JsonConfig(a.unet, "built-in " + a.name + " unet config");
  s.vae = io::JsonConfig(a.vae, "built-in " + a.name + " vae config");
  s.text_encoder = io::JsonConfig(a.text_encoder, "built-in " + a.name + " text_encoder config");
  if (!a.text_encoder_2.is_null())
    s.text_encoder_2 =
        io::JsonConfig(a.text_encoder_2, "built-in " + a.name + " text_encoder_2 config");
  return s;
}

// Builds the module without LibTorch's initialisation, directly in `dtype` (no float32 copy),
// then fills it with the model's weights or seeded random ones, and moves it to the device.
template <typename Module, typename Make>
Module build(Make make, torch::Dtype dtype, const torch::Device& device,
             const std::map<std::string, torch::Tensor>* weights, const std::string& source,
             uint64_t seed, const std::set<std::string>& ignored = {}) {
  Module m{nullptr};
  {
    nn::SkipInitGuard guard(dtype);
    m = make();
  }
  if (weights)
    nn::load_state_dict(*m, *weights, source, ignored);
  else
    nn::init_pooled_random_weights(*m, seed);
  m->to(device, dtype);
  // As the loaders do: a VAE stays NCHW on CUDA (nn::to_compute_layout).
  nn::use_compute_layout(*m, !std::is_same_v<Module, models::AutoencoderKL>);
  m->eval();
  return m;
}

UNetRun time_unet(models::UNet2DConditionModel& unet, const torch::Device& device,
                  torch::Dtype dtype, const PipelineBenchOptions& o, int64_t lh, int64_t lw,
                  int64_t vae_scale, int64_t ctx_dim, FlopCounts* flops,
                  PipelineBenchResult* profiled = nullptr) {
  auto gen = at::detail::createCPUGenerator(o.seed + 7);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  auto sample =
      torch::randn({o.batch, unet->config().in_channels, lh, lw}, gen, opts).to(device, dtype);
  auto context = torch::randn({o.batch, 77, ctx_dim}, gen, opts).to(device, dtype);
  auto t = torch::tensor(981.0).to(device);
  const auto added = random_added_conditions(unet->config(), o.batch, lh * vae_scale,
                                             lw * vae_scale, gen, device, dtype);
  const auto eager = [&] {
    return unet->forward(sample, t, context, nullptr, added_or_null(added));
  };
  std::function<void()> step = [&] { eager(); };
  UNetRun run;
  run.dtype = device::dtype_name(dtype);
  run.attention = nn::attention_backend_name(nn::default_attention_backend());
  for (int i = 0; i < o.warmup; ++i) {
    double t0 = now_s();
    step();
    sync_device(device);
    if (o.log) o.log("unet warm-up step: " + fmt("%.3f s", now_s() - t0));
  }
  // A replayed graph dispatches no operators, so the FLOPs are counted on an eager call here.
  device::DeviceGraph graph;
  torch::Tensor graph_out;
  if (o.graph) {
    torch::Tensor reference;
    {
      std::optional<FlopCounter> counter;
      if (flops) counter.emplace();
      reference = eager();
      sync_device(device);
      if (counter) *flops = counter->counts();
      flops = nullptr;
    }
    double t0 = now_s();
    graph.capture(device, [&] { graph_out = eager(); });
    graph.replay();
    sync_device(device);
    if (o.log) o.log("unet graph captured and replayed: " + fmt("%.3f s", now_s() - t0));
    run.graph = true;
    run.graph_identical = torch::equal(reference, graph_out);
    run.graph_max_abs_diff =
        (reference.to(torch::kFloat32) - graph_out.to(torch::kFloat32)).abs().max().item<double>();
    step = [&] { graph.replay(); };
  }
  device::CpuShareMeter cpu_meter(at::get_num_threads());
  for (int i = 0; i < o.steps; ++i) {
    // The first step also counts the step's FLOPs (the observer costs little).
    std::optional<FlopCounter> counter;
    if (flops && i == 0) counter.emplace();
    double t0 = now_s();
    step();
    sync_device(device);
    if (counter) *flops = counter->counts();
    run.step_s.push_back(now_s() - t0);
    if (o.log)
      o.log("unet step " + std::to_string(i + 1) + "/" + std::to_string(o.steps) + ": " +
            fmt("%.3f s", run.step_s.back()));
  }
  run.cpu = cpu_meter.share();
  double sum = 0;
  run.step_min_s = 1e30;
  for (double s : run.step_s) {
    sum += s;
    run.step_min_s = std::min(run.step_min_s, s);
  }
  run.step_mean_s = run.step_s.empty() ? 0 : sum / static_cast<double>(run.step_s.size());
  run.step_median_s = median(run.step_s);
  if (profiled) {
    OpProfile profile;
    double t0 = now_s();
    eager();  // the operators as dispatched (a replayed graph dispatches none)
    sync_device(device);
    profiled->profile_step_s = now_s() - t0;
    profiled->profile_kinds = profile.by_kind();
    profiled->profile_ops = profile.by_operator(12);
  }
  return run;
}

}  // namespace

void sync_device(const torch::Device& device) {
  if (device.is_cpu()) return;
  if (device.is_cuda()) {
    torch::cuda::synchronize();
    return;
  }
  // Other accelerators (npu): a blocking copy to the host runs after everything queued before it.
  torch::zeros({1}, torch::TensorOptions().device(device)).to(torch::kCPU);
}

double roofline_limit_s(const FlopCounts& flops, const Roofline& rl) {
  if (rl.conv_gflops <= 0 || rl.matmul_gflops <= 0) return 0;
  return flops.conv / 1e9 / rl.conv_gflops +
         (flops.matmul + flops.attention) / 1e9 / rl.matmul_gflops;
}

PipelineBenchResult run_pipeline_bench(const PipelineBenchOptions& o) {
  if (o.steps < 1) throw InvalidArgument("--steps must be >= 1, got " + std::to_string(o.steps));
  if (o.warmup < 0) throw InvalidArgument("--warmup must be >= 0, got " + std::to_string(o.warmup));
  if (o.batch < 1) throw InvalidArgument("--batch must be >= 1, got " + std::to_string(o.batch));
  if (o.width < 0 || o.height < 0 || o.width % 8 != 0 || o.height % 8 != 0)
    throw InvalidArgument("--width/--height must be multiples of 8, got " +
                          std::to_string(o.width) + "x" + std::to_string(o.height));
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  PipelineBenchResult r;
  r.arch = o.model.empty() ? o.arch : "";
  r.model = o.model;
  const torch::Device device = device::resolve_device(o.load.device);
  const torch::Dtype dtype = device::resolve_dtype(o.load.dtype, device, "unet");
  if (o.graph && !device::DeviceGraph::available(device))
    throw InvalidArgument("--graph: " + device::DeviceGraph::unavailable_reason(device));
  const torch::Dtype text_dtype = device::resolve_dtype(o.load.dtype, device, "text_encoder");
  const torch::Dtype vae_dtype = device::resolve_dtype(o.load.vae_dtype, device, "vae");
  const auto backend = nn::attention_backend_from_flag_or_env(o.load.attention, device);
  nn::set_default_attention_backend(backend);
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  r.text_encoder_dtype = device::dtype_name(text_dtype);
  r.vae_dtype = device::dtype_name(vae_dtype);
  r.attention = nn::attention_backend_name(backend);
  r.batch = o.batch;
  r.threads = at::get_num_threads();

  if (o.whole_image_steps > 0) {
    // First, while the page cache holds what it held before the command (the load is cold
    // after dropping caches); the stage benchmark below then reads the weights warm.
    WholeImageOptions w;
    w.model = o.model;
    w.load = o.load;
    w.width = o.width;
    w.height = o.height;
    w.steps = o.whole_image_steps;
    w.seed = o.seed;
    w.cuda_graph = o.graph;
    w.runs = o.whole_image_runs;
    if (o.roofline) {
      r.whole_image_roofline = measure_roofline(device, dtype, /*channels_last=*/false);
      if (vae_dtype != dtype)
        r.whole_image_vae_roofline = measure_roofline(device, vae_dtype, /*channels_last=*/false);
    }
    if (o.log) o.log("whole image: " + std::to_string(w.steps) + " steps through the pipeline");
    r.whole_image = run_whole_image_bench(w);
    device::empty_cache(torch::Device(torch::kCPU));  // the pipeline's memory, as it is freed
    nn::set_default_attention_backend(backend);
    if (o.log)
      o.log("whole image: load " + fmt("%.1f s", r.whole_image->load_s) + " (" +
            fmt("%.0f%%", 100 * r.whole_image->cache_before_load.fraction()) +
            " cached before), then " + fmt("%.1f s", r.whole_image->generate_s));
  }

  Source src = open_source(o);
  const auto unet_cfg = models::UNet2DConditionConfig::from_json(src.unet);
  const auto vae_cfg = models::AutoencoderKLConfig::from_json(src.vae);
  const auto text_cfg = models::ClipTextConfig::from_json(src.text_encoder);
  const int64_t f = vae_cfg.spatial_factor();
  const auto& ss = unet_cfg.sample_size;
  r.height = o.height ? o.height : static_cast<int>((ss.empty() ? 64 : ss[0]) * f);
  r.width = o.width ? o.width : static_cast<int>((ss.empty() ? 64 : ss.back()) * f);
  const int64_t lh = r.height / f, lw = r.width / f;
  if (lh % unet_cfg.spatial_factor() != 0 || lw % unet_cfg.spatial_factor() != 0)
    throw InvalidArgument("width and height must be multiples of " +
                          std::to_string(f * unet_cfg.spatial_factor()) + " for this model, got " +
                          std::to_string(r.width) + "x" + std::to_string(r.height));

  // Build everything first, as the pipeline holds all three networks.
  r.peak_rss_mb = mb(peak_rss_bytes());  // what the process used before (config parsing, ...)
  StagePeak build_peak(&r.peak_rss_mb, device);
  double t0 = now_s();
  const auto* m = src.model ? &*src.model : nullptr;
  auto text = build<models::ClipTextModel>(
      [&] { return models::ClipTextModel(text_cfg); }, text_dtype, device,
      m ? &m->text_encoders.front().weights : nullptr, o.model + " (text_encoder)", o.seed + 1,
      {"text_model.embeddings.position_ids"});
  // SDXL's second encoder (CLIP-G with its projection) runs in the same stage.
  models::ClipTextModel text_2{nullptr};
  if (src.text_encoder_2) {
    auto cfg = models::ClipTextConfig::from_json(*src.text_encoder_2);
    cfg.with_projection = true;
    text_2 = build<models::ClipTextModel>([&] { return models::ClipTextModel(cfg); }, text_dtype,
                                          device, m ? &m->text_encoders.at(1).weights : nullptr,
                                          o.model + " (text_encoder_2)", o.seed + 4,
                                          {"text_model.embeddings.position_ids"});
  }
  auto unet = build<models::UNet2DConditionModel>(
      [&] { return models::UNet2DConditionModel(unet_cfg); }, dtype, device,
      m ? &m->unet_weights : nullptr, o.model + " (unet)", o.seed + 2);
  auto vae = build<models::AutoencoderKL>([&] { return models::AutoencoderKL(vae_cfg); }, vae_dtype,
                                          device, m ? &m->vae_weights : nullptr, o.model + " (vae)",
                                          o.seed + 3);
  if (o.load.pack_conv_weights) nn::set_weight_packing(*unet, true);
  if (const auto type = quant::parse_weight_type(o.load.weights, "--weights")) {
    // As the pipeline does: the UNet's and the VAE's layers.
    for (torch::nn::Module* net : {static_cast<torch::nn::Module*>(unet.get()),
                                   static_cast<torch::nn::Module*>(vae.get())}) {
      nn::quantize_linear_layers(*net, *type);
      nn::quantize_conv_layers(*net, *type);
    }
  }
  src.model.reset();  // drop the weight file mappings, as the pipeline does
  r.build_s = now_s() - t0;
  r.build_peak_mb = build_peak.finish();
  r.build_device_peak_mb = build_peak.device_peak_mb();
  device::empty_cache(torch::Device(torch::kCPU));
  r.models_rss_mb = mb(current_rss_bytes());
  r.unet_params_m = params_m(*unet);
  r.text_encoder_params_m = params_m(*text) + (text_2 ? params_m(*text_2) : 0.0);
  r.vae_params_m = params_m(*vae);
  // The threads a generation of this model at this size runs with (a small step: one), so
  // that the stages and their roofline measure what txt2img does.
  std::optional<device::ScopedCpuThreads> generation_threads;
  if (device.is_cpu()) {
    const auto params = static_cast<int64_t>(std::llround(r.unet_params_m * 1e6));
    generation_threads.emplace(device::threads_for_step_work(
        pipeline::unet_step_flops(unet_cfg, params, o.batch, lh, lw)));
  }
  r.threads = at::get_num_threads();
  if (o.log)
    o.log("built text encoder (" + fmt("%.0fM", r.text_encoder_params_m) + " params), unet (" +
          fmt("%.0fM", r.unet_params_m) + "), vae (" + fmt("%.0fM", r.vae_params_m) + ") in " +
          fmt("%.1f s", r.build_s));

  // What the attention policy runs for the UNet's biggest self- and cross-attention.
  {
    const int64_t heads = unet_cfg.num_attention_heads[0],
                  dim = unet_cfg.block_out_channels[0] / heads;
    auto q = torch::empty({o.batch, heads, lh * lw, dim},
                          torch::TensorOptions().device(device).dtype(dtype));
    auto kc = torch::empty({o.batch, heads, 77, dim}, q.options());
    r.attention_self = nn::attention_backend_name(nn::select_attention_backend(q, q, q));
    r.attention_cross = nn::attention_backend_name(nn::select_attention_backend(q, kc, kc));
  }

  if (o.text_encoder) {
    StagePeak peak(&r.peak_rss_mb, device);
    auto gen = at::detail::createCPUGenerator(o.seed + 5);
    auto ids = torch::randint(0, text_cfg.vocab_size, {o.batch, text_cfg.max_position_embeddings},
                              gen, torch::TensorOptions().dtype(torch::kInt64))
                   .to(device);
    const auto encode = [&] {
      text->forward(ids, !text_2.is_empty());  // SDXL reads every layer's states
      if (text_2) text_2->forward(ids, true);
    };
    encode();  // warm-up
    sync_device(device);
    double s0 = now_s();
    encode();
    sync_device(device);
    r.text_encoder_s = now_s() - s0;
    r.text_encoder_peak_mb = peak.finish();
    r.text_encoder_device_peak_mb = peak.device_peak_mb();
    if (o.log)
      o.log("text encoder (batch " + std::to_string(o.batch) +
            "): " + fmt("%.3f s", r.text_encoder_s));
  }

  if (o.unet) {
    StagePeak peak(&r.peak_rss_mb, device);
    r.unet = time_unet(unet, device, dtype, o, lh, lw, f, unet_cfg.cross_attention_dim[0],
                       &r.unet_flops, o.profile ? &r : nullptr);
    r.unet_peak_mb = peak.finish();
    r.unet_device_peak_mb = peak.device_peak_mb();
    r.packed_weights_mb = mb(nn::packed_weight_bytes(*unet));
  }

  if (o.vae) {
    device::empty_cache(device);  // as the pipeline does between denoising and decoding
    StagePeak peak(&r.peak_rss_mb, device);
    auto gen = at::detail::createCPUGenerator(o.seed + 6);
    auto z = torch::randn({1, vae_cfg.latent_channels, lh, lw}, gen,
                          torch::TensorOptions().dtype(torch::kFloat32))
                 .to(device, vae_dtype);
    // On an accelerator the first decode loads kernels and plans its convolutions (0.1-1 s
    // on a GPU, more than the decode): one untimed decode first. A CPU decode has no such
    // cost worth a second decode.
    if (!device.is_cpu()) {
      vae->decode(z);
      sync_device(device);
    }
    double s0 = now_s();
    {
      FlopCounter counter;  // the observer costs little next to the decoder's convolutions
      vae->decode(z);
      sync_device(device);
      r.vae_flops = counter.counts();
    }
    r.vae_decode_s = now_s() - s0;
    r.vae_peak_mb = peak.finish();
    r.vae_device_peak_mb = peak.device_peak_mb();
    if (o.log) o.log("vae decode (1 image): " + fmt("%.3f s", r.vae_decode_s));
  }
  r.device_peak_mb = std::max({r.build_device_peak_mb, r.text_encoder_device_peak_mb,
                               r.unet_device_peak_mb, r.vae_device_peak_mb});

  if (o.roofline && o.unet) {
    r.roofline = measure_roofline(device, dtype, /*channels_last=*/false);
    const auto& rl = *r.roofline;
    r.roofline_limit_s = roofline_limit_s(r.unet_flops, rl);
    if (r.roofline_limit_s > 0) r.roofline_fraction = r.roofline_limit_s / r.unet.step_mean_s;
    if (o.log)
      o.log("roofline " + rl.dtype + ": matmul " + fmt("%.1f", rl.matmul_gflops) +
            " GFLOP/s, conv " + fmt("%.1f", rl.conv_gflops) + " GFLOP/s");
  }
  if (o.roofline && o.vae) {
    // The decoder's floor at the rates of its own dtype (a second roofline only if it differs).
    if (!r.roofline || vae_dtype != dtype)
      r.vae_roofline = measure_roofline(device, vae_dtype, /*channels_last=*/false);
    r.vae_roofline_limit_s =
        roofline_limit_s(r.vae_flops, r.vae_roofline ? *r.vae_roofline : *r.roofline);
  }

  if (r.whole_image && r.whole_image_roofline && o.unet && o.vae) {
    if (r.whole_image->width != r.width || r.whole_image->height != r.height)
      throw Error("whole image ran at " + std::to_string(r.whole_image->width) + "x" +
                  std::to_string(r.whole_image->height) + ", the stages at " +
                  std::to_string(r.width) + "x" + std::to_string(r.height));
    // The faster of the rates measured before and after: a noisy run cannot flatter the ratio.
    auto best = [](Roofline a, const std::optional<Roofline>& b) {
      if (b) {
        a.matmul_gflops = std::max(a.matmul_gflops, b->matmul_gflops);
        a.conv_gflops = std::max(a.conv_gflops, b->conv_gflops);
      }
      return a;
    };
    r.whole_image_roofline = best(*r.whole_image_roofline, r.roofline);
    if (r.whole_image_vae_roofline)
      r.whole_image_vae_roofline = best(*r.whole_image_vae_roofline, r.vae_roofline);
    const auto& rl = *r.whole_image_roofline;
    r.whole_image_limit_s =
        r.whole_image->steps * roofline_limit_s(r.unet_flops, rl) +
        roofline_limit_s(r.vae_flops,
                         r.whole_image_vae_roofline ? *r.whole_image_vae_roofline : rl);
  }

  if (o.baseline) {
    // Free the measured networks first: the float32 UNet needs the room.
    text = nullptr;
    vae = nullptr;
    unet = nullptr;
    device::empty_cache(torch::Device(torch::kCPU), device::HeapRelease::kAll);
    nn::set_default_attention_backend(nn::AttentionBackend::kMath);
    auto base =
        build<models::UNet2DConditionModel>([&] { return models::UNet2DConditionModel(unet_cfg); },
                                            torch::kFloat32, device, nullptr, "", o.seed + 2);
    if (o.log) o.log("baseline: float32 unet with math attention");
    r.baseline = time_unet(base, device, torch::kFloat32, o, lh, lw, f,
                           unet_cfg.cross_attention_dim[0], nullptr);
    nn::set_default_attention_backend(backend);
  }
  return r;
}

}  // namespace diffuse::bench
