#include "bench/accel_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "accel/deepcache.h"
#include "accel/token_merging_payoff.h"
#include "accel/unet_accelerator.h"
#include "bench/bench_util.h"
#include "bench/unet_inputs.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "models/autoencoder_kl.h"
#include "models/builtin_configs.h"
#include "models/unet2d_condition.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "schedulers/scheduler.h"
#include "train/scene.h"

namespace diffuse::bench {
namespace {

AccelSetting setting(const std::string& name, int interval, double ratio) {
  AccelSetting s;
  s.name = name;
  s.deep_cache.interval = interval;
  s.token_merging.ratio = ratio;
  s.token_merging.always = true;  // the method itself is measured; its policy beside it
  return s;
}

int count_full_steps(const AccelSetting& s, int steps) {
  const auto full = accel::deep_cache_full_steps(s.deep_cache, steps);
  return static_cast<int>(std::count(full.begin(), full.end(), true));
}

void finish_rows(AccelBenchResult& r) {
  const double reference = r.rows.empty() ? 0 : r.rows[0].denoise_s;
  for (auto& row : r.rows) row.speedup = row.denoise_s > 0 ? reference / row.denoise_s : 0;
}

// Quality: the demo model, every setting on the same prompts and seeds. The settings take
// turns image by image, so a change in machine load falls on all of them alike.
AccelBenchResult run_quality(const AccelBenchOptions& o) {
  LoadOptions lo;
  lo.device = o.device;
  lo.dtype = o.dtype;
  lo.vae_dtype = o.dtype;
  lo.attention = o.attention;
  auto pipe = Text2Image::load(o.model, lo);
  AccelBenchResult r;
  r.mode = "quality";
  r.model = o.model;
  r.device = pipe.info().device;
  r.dtype = pipe.info().unet_dtype;
  r.width = o.width ? o.width : pipe.info().default_width;
  r.height = o.height ? o.height : pipe.info().default_height;
  r.steps = o.steps;
  std::map<size_t, accel::TokenMergingPayoff> payoffs;  // by row
  for (const auto& s : o.settings) {
    AccelBenchRow row;
    row.name = s.name;
    row.full_steps = count_full_steps(s, o.steps);
    row.psnr_min = kIdenticalPsnr;
    r.rows.push_back(row);
  }
  const auto prompts = train::held_out_prompts(o.prompts);
  // One short untimed run per setting first: kernels meet their shapes once (oneDNN builds a
  // primitive per shape) before any clock runs.
  for (const auto& s : o.settings) {
    GenerationConfig cfg;
    cfg.prompts = {prompts[0]};
    cfg.steps = 4;
    cfg.scheduler = o.scheduler;
    cfg.width = o.width;
    cfg.height = o.height;
    cfg.seed = 0;
    cfg.deep_cache = s.deep_cache;
    cfg.deep_cache.interval = std::min(cfg.deep_cache.interval, 2);
    cfg.token_merging = s.token_merging;
    pipe.generate(cfg);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto spec = train::parse_caption(prompts[i]);
    for (int seed = 0; seed < o.seeds; ++seed) {
      torch::Tensor reference;
      for (size_t k = 0; k < o.settings.size(); ++k) {
        GenerationConfig cfg;
        cfg.prompts = {prompts[i]};
        cfg.steps = o.steps;
        cfg.scheduler = o.scheduler;
        cfg.guidance_scale = o.guidance_scale;
        cfg.width = o.width;
        cfg.height = o.height;
        cfg.seed = static_cast<uint64_t>(seed);
        cfg.deep_cache = o.settings[k].deep_cache;
        cfg.token_merging = o.settings[k].token_merging;
        const auto out = pipe.generate(cfg);
        auto& row = r.rows[k];
        row.denoise_s += out.timings.denoise_s;
        row.tally.add(train::score_scene(out.images[0], *spec));
        if (k == 0) reference = out.images_float;
        const double p = psnr(out.images_float, reference);
        row.psnr_mean += p;
        row.psnr_min = std::min(row.psnr_min, p);
        row.ssim_mean += ssim(out.images_float, reference);
        ++row.images;
      }
    }
    if (o.log)
      o.log("prompt " + std::to_string(i + 1) + "/" + std::to_string(prompts.size()) + " done");
  }
  for (auto& row : r.rows) {
    row.psnr_mean /= std::max(row.images, 1);
    row.ssim_mean /= std::max(row.images, 1);
  }
  finish_rows(r);
  return r;
}

// Speed: a full-size UNet with random weights, the denoising loop as the pipeline runs it
// (classifier-free guidance as a batch of 2, the scheduler's steps), without text encoder and
// VAE, whose time the accelerators do not change.
AccelBenchResult run_speed(const AccelBenchOptions& o) {
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  const models::ArchConfigs& a = models::builtin_arch(o.arch);
  const auto unet_cfg =
      models::UNet2DConditionConfig::from_json(io::JsonConfig(a.unet, "built-in " + a.name));
  const auto vae_cfg =
      models::AutoencoderKLConfig::from_json(io::JsonConfig(a.vae, "built-in " + a.name));
  const io::JsonConfig scheduler_cfg(a.scheduler, "built-in " + a.name + " scheduler");
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "unet");
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env(o.attention, device));
  AccelBenchResult r;
  r.mode = "speed";
  r.model = a.name + " (random weights)";
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  const int64_t f = vae_cfg.spatial_factor();
  const auto& ss = unet_cfg.sample_size;
  r.width = o.width ? o.width : static_cast<int>((ss.empty() ? 64 : ss.back()) * f);
  r.height = o.height ? o.height : static_cast<int>((ss.empty() ? 64 : ss[0]) * f);
  r.steps = o.steps;

  models::UNet2DConditionModel unet{nullptr};
  {
    nn::SkipInitGuard guard(dtype);
    unet = models::UNet2DConditionModel(unet_cfg);
  }
  nn::init_pooled_random_weights(*unet, 2);
  unet->to(device, dtype);
  unet->eval();
  auto gen = at::detail::createCPUGenerator(7);
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto start =
      torch::randn({1, unet_cfg.in_channels, r.height / f, r.width / f}, gen, fp32).to(device);
  const auto context =
      torch::randn({2, 77, unet_cfg.cross_attention_dim[0]}, gen, fp32).to(device, dtype);
  const auto added = random_added_conditions(unet_cfg, 2, r.height, r.width, gen, device, dtype);

  std::map<size_t, accel::TokenMergingPayoff> payoffs;  // by row
  for (const auto& s : o.settings) {
    AccelBenchRow row;
    row.name = s.name;
    row.full_steps = count_full_steps(s, o.steps);
    row.denoise_s = 1e30;
    if (s.token_merging.ratio > 0) {
      const auto payoff = accel::measure_token_merging(
          *unet, unet_cfg, accel::token_merging_sites(s.token_merging, unet_cfg), 2, start.size(2),
          start.size(3), s.token_merging.ratio, torch::TensorOptions(dtype).device(device));
      row.tome_site_speedup = payoff.speedup();
      payoffs.emplace(r.rows.size(), payoff);
    }
    r.rows.push_back(row);
  }
  // Round 0 is an untimed warm-up of 2 steps (a full and a shallow one). In the timed rounds
  // the settings advance in lockstep, one UNet step each in turn, each step timed on its own:
  // a change in machine load falls on all of them alike.
  struct Run {
    std::unique_ptr<schedulers::Scheduler> scheduler;
    std::unique_ptr<accel::UNetAccelerator> accel;
    torch::Tensor latents;
    double seconds = 0;
  };
  for (int rep = 0; rep <= std::max(o.repeats, 1); ++rep) {
    const int steps = rep == 0 ? 2 : o.steps;
    std::vector<Run> runs(o.settings.size());
    int64_t n = 0;
    for (size_t k = 0; k < runs.size(); ++k) {
      auto& run = runs[k];
      run.scheduler = schedulers::make_scheduler(o.scheduler, scheduler_cfg);
      run.scheduler->set_timesteps(steps);
      n = run.scheduler->timesteps().size(0);
      GenerationConfig cfg;
      cfg.deep_cache = o.settings[k].deep_cache;
      cfg.token_merging = o.settings[k].token_merging;
      if (rep == 0) cfg.deep_cache.interval = std::min(cfg.deep_cache.interval, 2);
      run.accel = std::make_unique<accel::UNetAccelerator>(cfg, unet_cfg, n, 0);
      run.latents = start * run.scheduler->init_noise_sigma();
    }
    for (int64_t i = 0; i < n; ++i)
      for (auto& run : runs) {
        const double t0 = now_s();
        const auto t = run.scheduler->timesteps()[i];
        auto input = run.scheduler->scale_model_input(torch::cat({run.latents, run.latents}), t);
        auto pred = run.accel->forward(*unet, i, input.to(dtype), t, context, added_or_null(added))
                        .to(torch::kFloat32);
        auto chunks = pred.chunk(2);
        pred = chunks[0] + o.guidance_scale * (chunks[1] - chunks[0]);
        run.latents = run.scheduler->step(pred, t, run.latents, {}).prev_sample;
        sync_device(device);
        run.seconds += now_s() - t0;
      }
    if (rep == 0) continue;
    for (size_t k = 0; k < runs.size(); ++k) {
      auto& row = r.rows[k];
      row.denoise_s = std::min(row.denoise_s, runs[k].seconds);
      row.images = 1;
      if (o.log)
        o.log(o.settings[k].name + ": " + fmt("%.1f s", runs[k].seconds) + " (" +
              std::to_string(row.full_steps) + " full UNet steps of " + std::to_string(o.steps) +
              ")");
    }
  }
  finish_rows(r);
  // The policy's verdict needs a plain UNet call's time: the plain setting's loop gives it.
  for (size_t k = 0; k < o.settings.size(); ++k) {
    const auto& s = o.settings[k];
    if (s.deep_cache.interval != 1 || s.token_merging.ratio > 0) continue;
    for (auto& [row, payoff] : payoffs) {
      payoff.call_s = r.rows[k].denoise_s / o.steps;
      r.rows[row].tome_call_speedup = payoff.call_speedup();
      r.rows[row].tome_kept = payoff.pays(o.steps, false);
    }
    break;
  }
  return r;
}

}  // namespace

std::vector<AccelSetting> default_accel_settings() {
  auto both = setting("deepcache 3 + tome 0.5", 3, 0.5);
  return {setting("off", 1, 0),
          setting("deepcache 2", 2, 0),
          setting("deepcache 3", 3, 0),
          setting("deepcache 5", 5, 0),
          setting("tome 0.3", 1, 0.3),
          setting("tome 0.5", 1, 0.5),
          both};
}

AccelBenchResult run_accel_bench(const AccelBenchOptions& o) {
  if (o.prompts < 1 || o.seeds < 1 || o.steps < 1)
    throw InvalidArgument("bench accel: prompts, seeds and steps must be >= 1");
  if (o.settings.empty()) throw InvalidArgument("bench accel: no settings to compare");
  if (o.arch == "hidream-i1" || o.arch.rfind("flux", 0) == 0)
    throw InvalidArgument(
        "bench accel --arch " + o.arch +
        ": the full-size loop is for UNet accelerators; a DiT's caches skip whole blocks, so "
        "`diffuse bench --arch " +
        o.arch +
        "` times its blocks (a cached First-Block-Cache step runs the first one only) and "
        "`diffuse bench accel -m <HiDream folder> --cache SPEC` measures the caches on a model");
  for (const auto& s : o.settings) {
    GenerationConfig g;
    g.deep_cache = s.deep_cache;
    g.token_merging = s.token_merging;
    accel::validate_accel_config(g);
  }
  return o.arch.empty() ? run_quality(o) : run_speed(o);
}

double psnr(const torch::Tensor& a, const torch::Tensor& b) {
  const double mse = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).pow(2).mean().item<double>();
  if (mse <= 0) return kIdenticalPsnr;
  return std::min(kIdenticalPsnr, 10.0 * std::log10(1.0 / mse));
}

double ssim(const torch::Tensor& a, const torch::Tensor& b) {
  // [N, H, W, 3] -> [N*3, 1, H, W], one Gaussian-weighted window per pixel.
  auto planes = [](const torch::Tensor& x) {
    auto p = x.to(torch::kFloat64).permute({0, 3, 1, 2});
    return p.reshape({p.size(0) * p.size(1), 1, p.size(2), p.size(3)});
  };
  auto x = planes(a), y = planes(b);
  const int64_t size = std::min<int64_t>({11, x.size(2), x.size(3)});
  auto g = torch::arange(size, torch::kFloat64) - (size - 1) / 2.0;
  g = torch::exp(-g * g / (2 * 1.5 * 1.5));
  g = g / g.sum();
  const auto window = torch::outer(g, g).view({1, 1, size, size});
  auto blur = [&](const torch::Tensor& t) { return torch::conv2d(t, window); };
  const auto mx = blur(x), my = blur(y);
  const auto vx = blur(x * x) - mx * mx, vy = blur(y * y) - my * my, cxy = blur(x * y) - mx * my;
  const double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  const auto map =
      ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2));
  return map.mean().item<double>();
}

}  // namespace diffuse::bench
