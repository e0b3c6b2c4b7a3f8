// What every `diffuse train-demo` architecture shares: the staged output folder, the scene
// stream, the learning-rate schedule, the budgeted stage loop, EMA weights, bf16 autocast, and
// the autoencoder stage (both demo models train an AutoencoderKL on the same world first).
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "models/autoencoder_kl.h"
#include "train/demo_trainer.h"
#include "train/scene.h"

namespace diffuse::train {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// The output folder: checked before training, written under a temporary sibling name and
// renamed into place at the end; the destructor removes whatever was not committed.
class StagedFolder {
 public:
  StagedFolder(const std::string& out, bool force);
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;
  const std::filesystem::path& path() const { return staging_; }
  void commit();

 private:
  std::filesystem::path out_, staging_;
  bool committed_ = false;
};

// Renders scenes in parallel and returns them as a [B, 3, R, R] float32 tensor in [-1, 1].
torch::Tensor render_batch(const std::vector<Scene>& scenes, int res);

// Scenes for training, never one whose caption (without size words) is a held-out prompt.
class SceneSource {
 public:
  SceneSource(uint64_t seed, const std::vector<std::string>& held_out);
  Scene next();
  std::vector<Scene> next(int n);
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::set<std::string> held_out_;
};

// Linear warm-up over a fixed number of steps (so that the first steps, which time a
// budgeted run, do not depend on the total), then cosine decay to 10 %.
double learning_rate(int64_t step, int64_t total, double base);
void set_learning_rate(torch::optim::AdamW& opt, double lr);

inline void throw_if_cancelled(const std::atomic<bool>* cancel) {
  if (cancel && cancel->load())
    throw Cancelled("train-demo: interrupted; no model folder was written");
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
    throw_if_cancelled(cancel);
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
  explicit Ema(const std::vector<torch::Tensor>& params);
  void update(int64_t step, int64_t total_steps);
  void copy_to_params();

 private:
  std::vector<torch::Tensor> params_, shadow_;
};

// bf16 autocast for the CPU while alive: matmuls and convolutions in bf16 (oneDNN), the rest
// in float32. Forward passes only, as autocast wants.
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_, prev_;
};

int64_t count_parameters(torch::nn::Module& m);

// InvalidArgument for options no run can use (before anything is written); the image size must
// be a multiple of the VAE factor times the denoiser's patch, the autoencoder's crop one of the
// VAE factor.
void validate_train_options(const TrainDemoOptions& options, int vae_factor, int patch);

// Whether a run with this --precision trains under bf16 autocast (auto: where the engine's
// dtype policy picks bf16 for the CPU, i.e. native bf16 dot products).
bool train_in_bf16(const std::string& precision);

struct AutoencoderStage {
  int64_t steps = 0;  // 0: as many as budget_s allows
  double budget_s = 0;
  int batch = 16;
  int crop = 64;
  int resolution = 128;
};
// The options' autoencoder stage with `budget_s` of the time budget.
AutoencoderStage autoencoder_stage(const TrainDemoOptions& o, double budget_s);

// training.json: the command that repeats the run exactly (the step counts it ran), the
// settings, each stage's steps, loss and time, and the held-out prompts. The denoiser's stage
// is named `denoiser` ("unet", "transformer") and its dataset counts `dataset_unit`.
nlohmann::ordered_json training_record(const TrainDemoOptions& o, const TrainReport& report,
                                       bool bf16, const char* denoiser, const char* dataset_unit,
                                       const std::vector<std::string>& held_out);

// Trains `vae` on random crops of rendered scenes: L1 + L2 reconstruction and a small KL term;
// records the steps, the running loss and the time in report.vae_*. Leaves the model in eval
// mode.
void train_autoencoder(models::AutoencoderKL& vae, SceneSource& source,
                       const AutoencoderStage& stage, bool bf16, at::Generator& gen,
                       const TrainCallback& on_progress, const std::atomic<bool>* cancel,
                       TrainReport& report);

// The VAE's latent means of the scenes (float32, unscaled), in chunks, reporting progress as
// stage "encode".
torch::Tensor encode_scenes(models::AutoencoderKL& vae, const std::vector<Scene>& scenes,
                            int resolution, bool bf16, const TrainCallback& on_progress,
                            const std::atomic<bool>* cancel);

}  // namespace diffuse::train
