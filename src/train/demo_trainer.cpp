#include "train/demo_trainer.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "pipeline/component_writer.h"
#include "schedulers/scheduler_config.h"
#include "text/bpe_trainer.h"
#include "text/clip_tokenizer.h"
#include "train/demo_configs.h"
#include "train/scene.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace diffuse::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The output folder: checked before training, written under a temporary sibling name and
// renamed into place at the end; the destructor removes whatever was not committed.
class StagedFolder {
 public:
  StagedFolder(const std::string& out, bool force) : out_(out) {
    if (out.empty()) throw InvalidArgument("train-demo: --out is empty");
    std::error_code ec;
    if (fs::exists(out_, ec)) {
      if (!fs::is_directory(out_))
        throw InvalidArgument("train-demo: '" + out + "' exists and is not a folder");
      if (!fs::is_empty(out_, ec) && !force)
        throw InvalidArgument(
            "train-demo: '" + out +
            "' is not empty; choose another folder or pass --force to replace it");
    }
    fs::path abs = fs::absolute(out_).lexically_normal();
    if (abs.filename().empty()) abs = abs.parent_path();
    out_ = abs;
    fs::create_directories(out_.parent_path(), ec);
    staging_ = out_.parent_path() /
               ("." + out_.filename().string() + ".partial-" + std::to_string(::getpid()));
    fs::remove_all(staging_, ec);
    if (!fs::create_directory(staging_, ec))
      throw IoError("train-demo: cannot create '" + staging_.string() + "': " + ec.message());
  }
  ~StagedFolder() {
    std::error_code ec;
    if (!committed_) fs::remove_all(staging_, ec);
  }
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  const fs::path& path() const { return staging_; }

  void commit() {
    std::error_code ec;
    fs::path old;
    if (fs::exists(out_, ec)) {
      old = out_.parent_path() /
            ("." + out_.filename().string() + ".old-" + std::to_string(::getpid()));
      fs::rename(out_, old, ec);
      if (ec)
        throw IoError("train-demo: cannot move '" + out_.string() + "' aside: " + ec.message());
    }
    fs::rename(staging_, out_, ec);
    if (ec) {
      std::error_code ignored;
      if (!old.empty()) fs::rename(old, out_, ignored);
      throw IoError("train-demo: cannot rename the finished model to '" + out_.string() +
                    "': " + ec.message());
    }
    committed_ = true;
    if (!old.empty()) fs::remove_all(old, ec);
  }

 private:
  fs::path out_, staging_;
  bool committed_ = false;
};

// Renders scenes in parallel (sampled sequentially, so the stream is deterministic) and
// returns them as a [B, 3, R, R] float32 tensor in [-1, 1].
torch::Tensor render_batch(const std::vector<Scene>& scenes, int res) {
  const int64_t B = static_cast<int64_t>(scenes.size());
  auto out = torch::empty({B, 3, res, res});
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const Image img = render_scene(scenes[b], res, res);
      float* d = dst + b * 3 * res * res;
      for (int64_t i = 0; i < static_cast<int64_t>(res) * res; ++i)
        for (int c = 0; c < 3; ++c) d[c * res * res + i] = img.rgb[i * 3 + c] / 127.5f - 1.0f;
    }
  });
  return out;
}

// Scenes for training, never one whose caption (without size words) is a held-out prompt.
class SceneSource {
 public:
  SceneSource(uint64_t seed, const std::vector<std::string>& held_out)
      : rng_(seed), held_out_(held_out.begin(), held_out.end()) {}
  Scene next() {
    for (;;) {
      Scene s = sample_scene(rng_);
      if (!held_out_.count(caption(spec_of(s, false)))) return s;
    }
  }
  std::vector<Scene> next(int n) {
    std::vector<Scene> v;
    for (int i = 0; i < n; ++i) v.push_back(next());
    return v;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::set<std::string> held_out_;
};

// Linear warm-up over a fixed number of steps (so that the first steps, which time a
// budgeted run, do not depend on the total), then cosine decay to 10 %.
double learning_rate(int64_t step, int64_t total, double base) {
  constexpr int64_t kWarmup = 50;
  const double warm = std::min(1.0, static_cast<double>(step + 1) / kWarmup);
  const double span = std::max<int64_t>(1, total - kWarmup);
  const double progress = std::clamp(static_cast<double>(step - kWarmup) / span, 0.0, 1.0);
  return base * warm * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress)));
}

void set_learning_rate(torch::optim::AdamW& opt, double lr) {
  for (auto& group : opt.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

// Runs `step(i, total) -> loss` until done. With fixed_steps 0 the total is fixed after
// timing the first kCalibration steps against budget_s.
template <typename StepFn>
int64_t run_stage(const char* stage, int64_t fixed_steps, double budget_s, StepFn&& step,
                  const TrainCallback& on_progress, const std::atomic<bool>* cancel,
                  double& final_loss) {
  constexpr int64_t kCalibration = 8;
  int64_t total = fixed_steps > 0 ? fixed_steps : kCalibration;
  const auto t0 = Clock::now();
  Clock::time_point timing_start = t0;
  double running = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (cancel && cancel->load())
      throw Cancelled("train-demo: interrupted; no model folder was written");
    if (fixed_steps == 0 && i == 2) timing_start = Clock::now();
    const double loss = step(i, fixed_steps > 0 ? total : std::numeric_limits<int64_t>::max());
    if (!std::isfinite(loss))
      throw Error(std::string("train-demo: the ") + stage + " loss became non-finite at step " +
                  std::to_string(i + 1));
    running = i == 0 ? loss : 0.98 * running + 0.02 * loss;
    if (fixed_steps == 0 && i == kCalibration - 1) {
      const double per_step = seconds_since(timing_start) / (kCalibration - 2);
      total = std::max<int64_t>(kCalibration, static_cast<int64_t>(budget_s / per_step));
    }
    if (on_progress) {
      TrainProgress p;
      p.stage = stage;
      p.step = i + 1;
      p.total = total;
      p.loss = running;
      p.stage_elapsed_s = seconds_since(t0);
      p.eta_s = p.stage_elapsed_s / (i + 1) * (total - i - 1);
      on_progress(p);
    }
  }
  final_loss = running;
  return total;
}

// Exponential moving average of parameters (the weights that are saved).
class Ema {
 public:
  explicit Ema(const std::vector<torch::Tensor>& params) : params_(params) {
    for (const auto& p : params_) shadow_.push_back(p.detach().clone());
  }
  void update(int64_t step, int64_t total_steps) {
    torch::NoGradGuard no_grad;
    // About a tenth of the run in its horizon; early on the warm-up term is smaller.
    const double cap = std::clamp(1.0 - 10.0 / static_cast<double>(total_steps), 0.9, 0.9995);
    const double d = std::min(cap, (1.0 + step) / (10.0 + step));
    for (size_t i = 0; i < params_.size(); ++i) shadow_[i].mul_(d).add_(params_[i].detach(), 1 - d);
  }
  void copy_to_params() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(shadow_[i]);
  }

 private:
  std::vector<torch::Tensor> params_, shadow_;
};

// bf16 autocast for the CPU: matmuls and convolutions in bf16 (oneDNN), the rest in float32.
// libtorch 2.4 names the device in the autocast calls; the CPU-only names are deprecated there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool cpu_autocast_enabled() {
  return at::autocast::is_autocast_enabled(at::kCPU);
}
inline void set_cpu_autocast(bool on) {
  at::autocast::set_autocast_enabled(at::kCPU, on);
}
inline void set_cpu_autocast_dtype(at::ScalarType t) {
  at::autocast::set_autocast_dtype(at::kCPU, t);
}
#else
inline bool cpu_autocast_enabled() {
  return at::autocast::is_cpu_enabled();
}
inline void set_cpu_autocast(bool on) {
  at::autocast::set_cpu_enabled(on);
}
inline void set_cpu_autocast_dtype(at::ScalarType t) {
  at::autocast::set_autocast_cpu_dtype(t);
}
#endif

class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled), prev_(cpu_autocast_enabled()) {
    if (!enabled_) return;
    set_cpu_autocast(true);
    set_cpu_autocast_dtype(at::kBFloat16);
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    set_cpu_autocast(prev_);
    at::autocast::clear_cache();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_, prev_;
};

int64_t count_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

TrainReport train_demo(const TrainDemoOptions& o, const TrainCallback& on_progress,
                       const std::atomic<bool>* cancel) {
  if (o.resolution < 32 || o.resolution % 8 != 0)
    throw InvalidArgument("train-demo: resolution must be a multiple of 8 and at least 32, got " +
                          std::to_string(o.resolution));
  if (!(o.minutes > 0) || o.minutes > 7 * 24 * 60)
    throw InvalidArgument("train-demo: --minutes must be in (0, 10080], got " +
                          std::to_string(o.minutes));
  if (o.vae_crop < 16 || o.vae_crop % 8 != 0 || o.vae_crop > o.resolution)
    throw InvalidArgument("train-demo: the autoencoder crop must be a multiple of 8 in [16, " +
                          std::to_string(o.resolution) + "], got " + std::to_string(o.vae_crop));
  if (o.vae_steps < 0 || o.unet_steps < 0 || o.vae_batch < 1 || o.unet_batch < 1 ||
      o.dataset_size < 1)
    throw InvalidArgument("train-demo: step counts must be >= 0 and batch/dataset sizes >= 1");
  if (o.precision != "auto" && o.precision != "fp32" && o.precision != "bf16")
    throw InvalidArgument("train-demo: --precision must be auto, fp32 or bf16, got '" +
                          o.precision + "'");
  const bool bf16 =
      o.precision == "bf16" ||
      (o.precision == "auto" &&
       device::resolve_dtype("auto", torch::Device(torch::kCPU), "unet") == torch::kBFloat16);
  StagedFolder folder(o.out, o.force);
  device::configure_cpu_threads();
  // Training allocates and frees the same activation-sized buffers every step (page faults
  // were 30-40 % of the step time here without this).
  device::keep_freed_memory();
  const auto t_start = Clock::now();
  const double budget_s = o.minutes * 60;
  TrainReport report;
  torch::manual_seed(o.seed);
  auto gen = at::detail::createCPUGenerator(o.seed);

  // Tokenizer: a BPE vocabulary learned from the world's captions.
  std::mt19937_64 corpus_rng(o.seed ^ 0xC0FFEEull);
  std::vector<std::string> corpus;
  for (int i = 0; i < 4000; ++i) {
    const Scene s = sample_scene(corpus_rng);
    corpus.push_back(caption(spec_of(s, true)));
    corpus.push_back(caption(spec_of(s, false)));
  }
  const auto vocab = text::train_clip_bpe(corpus, 400);
  const int max_tokens = kDemoMaxTokens;
  text::save_clip_tokenizer(vocab, (folder.path() / "tokenizer").string(), max_tokens);
  const auto tokenizer = text::ClipTokenizer::from_folder((folder.path() / "tokenizer").string());
  const auto vocab_size = static_cast<int64_t>(vocab.tokens.size());

  const auto vae_json = demo_vae_config(o.resolution);
  const auto unet_json = demo_unet_config(o.resolution / 8);
  const auto te_json = demo_text_encoder_config(vocab_size, vocab_size - 2, vocab_size - 1);
  const auto sched_json = demo_scheduler_config();
  auto vae = models::AutoencoderKL(
      models::AutoencoderKLConfig::from_json(io::JsonConfig(vae_json, "demo vae")));
  auto unet = models::UNet2DConditionModel(
      models::UNet2DConditionConfig::from_json(io::JsonConfig(unet_json, "demo unet")));
  auto text_encoder = models::ClipTextModel(
      models::ClipTextConfig::from_json(io::JsonConfig(te_json, "demo text_encoder")));
  report.parameters =
      count_parameters(*vae) + count_parameters(*unet) + count_parameters(*text_encoder);

  const auto held_out = held_out_prompts();
  SceneSource source(o.seed, held_out);

  // Stage 1: the autoencoder.
  {
    const auto t0 = Clock::now();
    vae->train();
    constexpr double kBaseLr = 1e-3, kKlWeight = 1e-4;
    torch::optim::AdamW opt(vae->parameters(),
                            torch::optim::AdamWOptions(kBaseLr).betas({0.9, 0.99}).weight_decay(0));
    auto step = [&](int64_t i, int64_t total) {
      set_learning_rate(opt, learning_rate(i, total, kBaseLr));
      // Random crops: the autoencoder is convolutional, and a crop teaches it colours and edges
      // at the scale of the full image for a quarter of the cost.
      const auto full = render_batch(source.next(o.vae_batch), o.resolution);
      std::vector<torch::Tensor> crops;
      const int c = o.vae_crop, span = o.resolution - o.vae_crop + 1;
      for (int b = 0; b < o.vae_batch; ++b) {
        const int y = static_cast<int>(source.rng()() % span) & ~7;
        const int x0 = static_cast<int>(source.rng()() % span) & ~7;
        crops.push_back(full[b].narrow(1, y, c).narrow(2, x0, c));
      }
      const auto x = torch::stack(crops);
      torch::Tensor loss;
      {
        AutocastGuard autocast(bf16);  // the forward pass only, as autocast wants
        const auto dist = vae->encode(x);
        const auto mean = dist.mean.to(torch::kFloat32);
        const auto logvar = dist.logvar.to(torch::kFloat32);
        const auto z = mean + (0.5 * logvar).exp() * at::randn(mean.sizes(), gen);
        const auto diff = vae->decode(z).to(torch::kFloat32) - x;
        const auto kl = 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).mean();
        loss = diff.abs().mean() + diff.pow(2).mean() + kKlWeight * kl;
      }
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(vae->parameters(), 1.0);
      opt.step();
      return loss.item<double>();
    };
    report.vae_steps =
        run_stage("vae", o.vae_steps, 0.3 * budget_s, step, on_progress, cancel, report.vae_loss);
    vae->eval();
    report.vae_s = seconds_since(t0);
  }

  // Stage 2: the dataset of latents the UNet learns from.
  torch::Tensor latents;
  std::vector<Scene> scenes;
  {
    torch::NoGradGuard no_grad;
    const auto t0 = Clock::now();
    constexpr int64_t kChunk = 128;
    std::vector<torch::Tensor> parts;
    for (int64_t done = 0; done < o.dataset_size; done += kChunk) {
      if (cancel && cancel->load())
        throw Cancelled("train-demo: interrupted; no model folder was written");
      const int n = static_cast<int>(std::min(kChunk, o.dataset_size - done));
      auto batch = source.next(n);
      AutocastGuard autocast(bf16);
      parts.push_back(vae->encode(render_batch(batch, o.resolution)).mean.to(torch::kFloat32));
      scenes.insert(scenes.end(), batch.begin(), batch.end());
      if (on_progress) {
        TrainProgress p;
        p.stage = "encode";
        p.step = done + n;
        p.total = o.dataset_size;
        p.stage_elapsed_s = seconds_since(t0);
        p.eta_s = p.stage_elapsed_s / p.step * (p.total - p.step);
        on_progress(p);
      }
    }
    latents = torch::cat(parts);
    report.scaling_factor = 1.0 / latents.std().item<double>();
    latents.mul_(report.scaling_factor);
    report.encode_s = seconds_since(t0);
  }

  // Stage 3: UNet and text encoder together, epsilon prediction with min-SNR weighting and
  // 10 % empty captions (for classifier-free guidance).
  {
    const auto t0 = Clock::now();
    unet->train();
    text_encoder->train();
    std::vector<torch::Tensor> params = unet->parameters();
    for (const auto& p : text_encoder->parameters()) params.push_back(p);
    constexpr double kBaseLr = 4e-4;
    torch::optim::AdamW opt(
        params, torch::optim::AdamWOptions(kBaseLr).betas({0.9, 0.99}).weight_decay(0.01));
    schedulers::SchedulerConfig sched(io::JsonConfig(sched_json, "demo scheduler"));
    const auto alphas_cumprod =
        schedulers::alphas_cumprod_from_betas(sched.betas("linear", 0.0001, 0.02, false));
    const int64_t T = alphas_cumprod.size(0), N = latents.size(0);
    Ema ema(params);
    auto step = [&](int64_t i, int64_t total) {
      set_learning_rate(opt, learning_rate(i, total, kBaseLr));
      const auto idx = at::randint(N, {o.unet_batch}, gen, torch::kLong);
      const auto x0 = latents.index_select(0, idx);
      std::vector<std::string> captions;
      const auto* ids = idx.data_ptr<int64_t>();
      for (int b = 0; b < o.unet_batch; ++b) {
        const bool drop = source.rng()() % 10 == 0;
        captions.push_back(drop ? std::string() : caption(scenes[ids[b]], source.rng()));
      }
      const auto tokens = tokenizer.encode_padded(captions, max_tokens);
      std::vector<int64_t> flat;
      for (const auto& row : tokens.input_ids) flat.insert(flat.end(), row.begin(), row.end());
      const auto input_ids = torch::tensor(flat, torch::kLong).view({o.unet_batch, max_tokens});
      const auto t = at::randint(T, {o.unet_batch}, gen, torch::kLong);
      const auto noise = at::randn(x0.sizes(), gen);
      const auto ab = alphas_cumprod.index_select(0, t).view({-1, 1, 1, 1});
      const auto noisy = ab.sqrt() * x0 + (1 - ab).sqrt() * noise;
      torch::Tensor pred;
      {
        AutocastGuard autocast(bf16);  // the forward pass only, as autocast wants
        const auto context = text_encoder->forward(input_ids).last_hidden_state;
        pred = unet->forward(noisy, t.to(torch::kFloat32), context).to(torch::kFloat32);
      }
      const auto snr = (ab / (1 - ab)).view({-1});
      const auto weight = torch::clamp_max(snr, 5.0) / snr;
      auto loss = (weight * (pred - noise).pow(2).mean({1, 2, 3})).mean();
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(params, 1.0);
      opt.step();
      ema.update(i, total);
      return loss.item<double>();
    };
    // Whatever the first two stages left of the budget, less a little for writing.
    const double remaining = std::max(1.0, 0.98 * budget_s - seconds_since(t_start));
    report.unet_steps =
        run_stage("unet", o.unet_steps, remaining, step, on_progress, cancel, report.unet_loss);
    ema.copy_to_params();
    unet->eval();
    text_encoder->eval();
    report.unet_s = seconds_since(t0);
  }
  if (cancel && cancel->load())
    throw Cancelled("train-demo: interrupted; no model folder was written");

  // The folder.
  auto vae_out = vae_json;
  vae_out["scaling_factor"] = report.scaling_factor;
  const std::string made_by = "diffuse train-demo --seed " + std::to_string(o.seed);
  const auto root = folder.path();
  pipeline::write_json_file(root / "vae" / "config.json", vae_out);
  pipeline::save_module_weights(*vae, root / "vae" / "diffusion_pytorch_model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "unet" / "config.json", unet_json);
  pipeline::save_module_weights(*unet, root / "unet" / "diffusion_pytorch_model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "text_encoder" / "config.json", te_json);
  pipeline::save_module_weights(*text_encoder, root / "text_encoder" / "model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "scheduler" / "scheduler_config.json", sched_json);
  pipeline::write_json_file(
      root / "model_index.json",
      pipeline::stable_diffusion_model_index(
          sched_json.value("_class_name", "PNDMScheduler"),
          "trained from scratch by `diffuse train-demo` on the demo world (see training.json)"));
  report.total_s = seconds_since(t_start);
  ordered_json record = {
      {"command", "diffuse train-demo --seed " + std::to_string(o.seed) + " --vae-steps " +
                      std::to_string(report.vae_steps) + " --unet-steps " +
                      std::to_string(report.unet_steps) + " --resolution " +
                      std::to_string(o.resolution) + " --vae-batch " + std::to_string(o.vae_batch) +
                      " --vae-crop " + std::to_string(o.vae_crop) + " --unet-batch " +
                      std::to_string(o.unet_batch) + " --dataset " +
                      std::to_string(o.dataset_size) + " --precision " + (bf16 ? "bf16" : "fp32")},
      {"seed", o.seed},
      {"precision", bf16 ? "bf16" : "fp32"},
      {"resolution", o.resolution},
      {"vae",
       {{"steps", report.vae_steps},
        {"batch", o.vae_batch},
        {"crop", o.vae_crop},
        {"final_loss", report.vae_loss},
        {"seconds", report.vae_s}}},
      {"dataset", {{"scenes", o.dataset_size}, {"seconds", report.encode_s}}},
      {"unet",
       {{"steps", report.unet_steps},
        {"batch", o.unet_batch},
        {"final_loss", report.unet_loss},
        {"seconds", report.unet_s}}},
      {"scaling_factor", report.scaling_factor},
      {"parameters", report.parameters},
      {"threads", at::get_num_threads()},
      {"total_seconds", report.total_s},
      {"held_out_prompts", held_out}};
  pipeline::write_json_file(root / "training.json", record);
  report.record = record.dump(2);
  folder.commit();
  return report;
}

}  // namespace diffuse::train
