#include "train/train_loop.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>
#include <unistd.h>

#include <cmath>
#include <sstream>

#include "device/device.h"

namespace fs = std::filesystem;

namespace diffuse::train {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

StagedFolder::StagedFolder(const std::string& out, bool force) : out_(out) {
  if (out.empty()) throw InvalidArgument("train-demo: --out is empty");
  std::error_code ec;
  if (fs::exists(out_, ec)) {
    if (!fs::is_directory(out_))
      throw InvalidArgument("train-demo: '" + out + "' exists and is not a folder");
    if (!fs::is_empty(out_, ec) && !force)
      throw InvalidArgument("train-demo: '" + out +
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

StagedFolder::~StagedFolder() {
  std::error_code ec;
  if (!committed_) fs::remove_all(staging_, ec);
}

void StagedFolder::commit() {
  std::error_code ec;
  fs::path old;
  if (fs::exists(out_, ec)) {
    old = out_.parent_path() /
          ("." + out_.filename().string() + ".old-" + std::to_string(::getpid()));
    fs::rename(out_, old, ec);
    if (ec) throw IoError("train-demo: cannot move '" + out_.string() + "' aside: " + ec.message());
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

torch::Tensor render_batch(const std::vector<Scene>& scenes, int res) {
  const int64_t B = static_cast<int64_t>(scenes.size());
  auto out = torch::empty({B, 3, res, res});
  float* dst = out.data_ptr<float>();
  // Sampled sequentially by the caller (a deterministic stream), rendered in parallel.
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

SceneSource::SceneSource(uint64_t seed, const std::vector<std::string>& held_out)
    : rng_(seed), held_out_(held_out.begin(), held_out.end()) {}

Scene SceneSource::next() {
  for (;;) {
    Scene s = sample_scene(rng_);
    if (!held_out_.count(caption(spec_of(s, false)))) return s;
  }
}

std::vector<Scene> SceneSource::next(int n) {
  std::vector<Scene> v;
  for (int i = 0; i < n; ++i) v.push_back(next());
  return v;
}

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

Ema::Ema(const std::vector<torch::Tensor>& params) : params_(params) {
  for (const auto& p : params_) shadow_.push_back(p.detach().clone());
}

void Ema::update(int64_t step, int64_t total_steps) {
  torch::NoGradGuard no_grad;
  // About a tenth of the run in its horizon; early on the warm-up term is smaller.
  const double cap = std::clamp(1.0 - 10.0 / static_cast<double>(total_steps), 0.9, 0.9995);
  const double d = std::min(cap, (1.0 + step) / (10.0 + step));
  for (size_t i = 0; i < params_.size(); ++i) shadow_[i].mul_(d).add_(params_[i].detach(), 1 - d);
}

void Ema::copy_to_params() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(shadow_[i]);
}

namespace {

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

}  // namespace

AutocastGuard::AutocastGuard(bool enabled) : enabled_(enabled), prev_(cpu_autocast_enabled()) {
  if (!enabled_) return;
  set_cpu_autocast(true);
  set_cpu_autocast_dtype(at::kBFloat16);
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  set_cpu_autocast(prev_);
  at::autocast::clear_cache();
}

int64_t count_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

void validate_train_options(const TrainDemoOptions& o, int vae_factor, int patch) {
  const int multiple = vae_factor * patch;
  if (o.resolution < 32 || o.resolution % multiple != 0)
    throw InvalidArgument("train-demo: resolution must be a multiple of " +
                          std::to_string(multiple) + " and at least 32, got " +
                          std::to_string(o.resolution));
  if (!(o.minutes > 0) || o.minutes > 7 * 24 * 60)
    throw InvalidArgument("train-demo: --minutes must be in (0, 10080], got " +
                          std::to_string(o.minutes));
  const int crop_multiple = std::max(8, vae_factor);
  if (o.vae_crop < std::max(16, crop_multiple) || o.vae_crop % crop_multiple != 0 ||
      o.vae_crop > o.resolution)
    throw InvalidArgument("train-demo: the autoencoder crop must be a multiple of " +
                          std::to_string(crop_multiple) + " in [" +
                          std::to_string(std::max(16, crop_multiple)) + ", " +
                          std::to_string(o.resolution) + "], got " + std::to_string(o.vae_crop));
  if (o.vae_steps < 0 || o.unet_steps < 0 || o.vae_batch < 1 || o.unet_batch < 1 ||
      o.dataset_size < 1)
    throw InvalidArgument("train-demo: step counts must be >= 0 and batch/dataset sizes >= 1");
  // Bounds that keep a typo from allocating tens of GiB before the first step.
  if (o.resolution > 1024 || o.vae_batch > 1024 || o.unet_batch > 4096 ||
      o.dataset_size > (int64_t{1} << 21))
    throw InvalidArgument(
        "train-demo: at most --resolution 1024, --vae-batch 1024, --unet-batch 4096 and "
        "--dataset 2097152 (got " +
        std::to_string(o.resolution) + ", " + std::to_string(o.vae_batch) + ", " +
        std::to_string(o.unet_batch) + ", " + std::to_string(o.dataset_size) + ")");

  train_in_bf16(o.precision);  // refuses an unknown precision now, before the folder
}

bool train_in_bf16(const std::string& precision) {
  if (precision != "auto" && precision != "fp32" && precision != "bf16")
    throw InvalidArgument("train-demo: --precision must be auto, fp32 or bf16, got '" + precision +
                          "'");
  return precision == "bf16" ||
         (precision == "auto" &&
          device::resolve_dtype("auto", torch::Device(torch::kCPU), "unet") == torch::kBFloat16);
}

AutoencoderStage autoencoder_stage(const TrainDemoOptions& o, double budget_s) {
  AutoencoderStage stage;
  stage.steps = o.vae_steps;
  stage.budget_s = budget_s;
  stage.batch = o.vae_batch;
  stage.crop = o.vae_crop;
  stage.resolution = o.resolution;
  return stage;
}

namespace {
std::string format_lr(double lr) {
  std::ostringstream os;
  os << lr;  // six significant digits: 0.00025, 1e-05
  return os.str();
}
}  // namespace

nlohmann::ordered_json training_record(const TrainDemoOptions& o, const TrainReport& report,
                                       bool bf16, const char* denoiser, const char* dataset_unit,
                                       const std::vector<std::string>& held_out) {
  const std::string arch = o.arch == "sd" ? "" : " --arch " + o.arch;
  return {
      {"command",
       "diffuse train-demo" + arch + " --seed " + std::to_string(o.seed) + " --vae-steps " +
           std::to_string(report.vae_steps) + " --unet-steps " + std::to_string(report.unet_steps) +
           " --resolution " + std::to_string(o.resolution) + " --vae-batch " +
           std::to_string(o.vae_batch) + " --vae-crop " + std::to_string(o.vae_crop) +
           " --unet-batch " + std::to_string(o.unet_batch) + " --dataset " +
           std::to_string(o.dataset_size) + " --precision " + (bf16 ? "bf16" : "fp32") +
           (o.learning_rate > 0 ? " --learning-rate " + format_lr(o.learning_rate)
                                : std::string()) +
           (o.init_from.empty() ? "" : " --init-from " + o.init_from) +
           (o.edit_mix.empty() || o.edit_mix == "natural" ? std::string()
                                                          : " --edit-mix " + o.edit_mix)},
      {"arch", o.arch},
      {"seed", o.seed},
      {"precision", bf16 ? "bf16" : "fp32"},
      {"resolution", o.resolution},
      {"vae",
       {{"steps", report.vae_steps},
        {"batch", o.vae_batch},
        {"crop", o.vae_crop},
        {"final_loss", report.vae_loss},
        {"seconds", report.vae_s}}},
      {"dataset", {{dataset_unit, o.dataset_size}, {"seconds", report.encode_s}}},
      {denoiser,
       {{"steps", report.unet_steps},
        {"batch", o.unet_batch},
        {"final_loss", report.unet_loss},
        {"seconds", report.unet_s}}},
      {"scaling_factor", report.scaling_factor},
      {"parameters", report.parameters},
      {"threads", at::get_num_threads()},
      {"total_seconds", report.total_s},
      {"held_out_prompts", held_out}};
}

void train_autoencoder(models::AutoencoderKL& vae, SceneSource& source, const AutoencoderStage& s,
                       bool bf16, at::Generator& gen, const TrainCallback& on_progress,
                       const std::atomic<bool>* cancel, TrainReport& report) {
  const auto t0 = Clock::now();
  vae->train();
  constexpr double kBaseLr = 1e-3, kKlWeight = 1e-4;
  torch::optim::AdamW opt(vae->parameters(),
                          torch::optim::AdamWOptions(kBaseLr).betas({0.9, 0.99}).weight_decay(0));
  auto step = [&](int64_t i, int64_t total) {
    set_learning_rate(opt, learning_rate(i, total, kBaseLr));
    // Random crops: the autoencoder is convolutional, and a crop teaches it colours and edges
    // at the scale of the full image for a quarter of the cost.
    const auto full = render_batch(source.next(s.batch), s.resolution);
    std::vector<torch::Tensor> crops;
    const int c = s.crop, span = s.resolution - s.crop + 1;
    for (int b = 0; b < s.batch; ++b) {
      const int y = static_cast<int>(source.rng()() % span) & ~7;
      const int x0 = static_cast<int>(source.rng()() % span) & ~7;
      crops.push_back(full[b].narrow(1, y, c).narrow(2, x0, c));
    }
    const auto x = torch::stack(crops);
    torch::Tensor loss;
    {
      AutocastGuard autocast(bf16);
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
      run_stage("vae", s.steps, s.budget_s, step, on_progress, cancel, report.vae_loss);
  vae->eval();
  report.vae_s = seconds_since(t0);
}

torch::Tensor encode_scenes(models::AutoencoderKL& vae, const std::vector<Scene>& scenes,
                            int resolution, bool bf16, const TrainCallback& on_progress,
                            const std::atomic<bool>* cancel) {
  torch::NoGradGuard no_grad;
  const auto t0 = Clock::now();
  constexpr int64_t kChunk = 128;
  const int64_t total = static_cast<int64_t>(scenes.size());
  std::vector<torch::Tensor> parts;
  for (int64_t done = 0; done < total; done += kChunk) {
    throw_if_cancelled(cancel);
    const int64_t n = std::min(kChunk, total - done);
    std::vector<Scene> batch(scenes.begin() + done, scenes.begin() + done + n);
    AutocastGuard autocast(bf16);
    parts.push_back(vae->encode(render_batch(batch, resolution)).mean.to(torch::kFloat32));
    if (on_progress) {
      TrainProgress p;
      p.stage = "encode";
      p.step = done + n;
      p.total = total;
      p.stage_elapsed_s = seconds_since(t0);
      p.eta_s = p.stage_elapsed_s / p.step * (p.total - p.step);
      on_progress(p);
    }
  }
  return torch::cat(parts);
}

}  // namespace diffuse::train
