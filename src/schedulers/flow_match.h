// Shared base of the flow-matching schedulers (rectified flow: x_sigma = (1 - sigma) * x0 +
// sigma * noise, and the model predicts the velocity noise - x0): the shifted sigma schedule,
// timesteps = sigma * num_train_timesteps, resolution-dependent shifting with `mu`, and
// add_noise as diffusers' scale_noise. Every stage uses the dtype diffusers 0.34 uses (numpy
// float64, then torch float32), so schedules match the reference bit for bit.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

enum class TimeShiftType { kExponential, kLinear };
enum class FlowSigmaConversion { kNone, kKarras, kExponential };

struct FlowScheduleOptions {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;                    // the config's static shift (bounds of the schedule)
  std::optional<double> shift_override;  // set_shift's: replaces `shift` in the shifting step
  bool dynamic_shifting = false;         // shift by set_shift_mu's mu instead
  TimeShiftType time_shift = TimeShiftType::kExponential;
  std::optional<double> shift_terminal;  // stretch the schedule to end at this sigma
  FlowSigmaConversion conversion = FlowSigmaConversion::kNone;
};

// The pipelines' calculate_shift: mu grows linearly with the image sequence length, from
// base_shift at base_seq_len to max_shift at max_seq_len (float64, same operation order).
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len = 256,
                       int64_t max_seq_len = 4096, double base_shift = 0.5,
                       double max_shift = 1.15);

// Resolution-dependent shift of one sigma in (0, 1]: e^mu / (e^mu + (1/sigma - 1))
// (exponential) or mu / (mu + (1/sigma - 1)) (linear).
double time_shift(TimeShiftType type, double mu, double sigma);

struct FlowSchedule {
  std::vector<float> timesteps;  // descending, sigma * num_train_timesteps
  std::vector<float> sigmas;     // timesteps.size() + 1 entries, terminal 0 appended
};

// The schedule of `n` inference steps. `mu` is required (InvalidArgument) with dynamic shifting
// and ignored without.
FlowSchedule make_flow_schedule(const FlowScheduleOptions& options, int n,
                                std::optional<double> mu);

// The schedule from given sigmas (diffusers' set_timesteps(sigmas=...)): cast to float32, then
// shifted (mu or the static shift) in float32 arithmetic as numpy does on a float32 array, the
// other conversions as make_flow_schedule's.
FlowSchedule make_flow_schedule_from_sigmas(const FlowScheduleOptions& options,
                                            const std::vector<double>& sigmas,
                                            std::optional<double> mu);

// The sigmas FLUX pipelines pass: linspace(1, 1/n, n) (float64).
std::vector<double> flux_default_sigmas(int n);

class FlowMatchScheduler : public Scheduler {
 public:
  void set_timesteps(int num_inference_steps) override;
  // diffusers' set_timesteps(sigmas=sigmas): one step per sigma (each in (0, 1], descending),
  // shifted like the default schedule. InvalidArgument for an empty list or sigmas outside
  // (0, 1].
  void set_timesteps_from_sigmas(const std::vector<double>& sigmas);
  void set_shift_mu(std::optional<double> mu) override { mu_ = mu; }
  void set_shift(std::optional<double> shift) override;
  // sigma * noise + (1 - sigma) * original in the sample's dtype (diffusers' scale_noise).
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;

  bool dynamic_shifting() const { return options_.dynamic_shifting; }
  // calculate_shift with this config's base/max shift and sequence lengths: the mu a pipeline
  // passes for an image of `image_seq_len` latent tokens.
  double shift_mu_for(int64_t image_seq_len) const;

 protected:
  // Reads num_train_timesteps, shift, use_dynamic_shifting, base_shift, max_shift,
  // base_image_seq_len, max_image_seq_len, invert_sigmas, use_karras_sigmas,
  // use_exponential_sigmas, use_beta_sigmas, and, if `terminal_and_type` (diffusers' classes,
  // not hi_diffusers'), shift_terminal and time_shift_type. ConfigError for bad or
  // unsupported values.
  FlowMatchScheduler(const SchedulerConfig& config, bool terminal_and_type);

  // Index of `timestep` in the schedule and the sigmas around it, for step().
  struct StepSigmas {
    int64_t index;
    float sigma;
    float sigma_next;
  };
  StepSigmas begin_step(const torch::Tensor& timestep);

  FlowScheduleOptions options_;

 private:
  double base_shift_, max_shift_;
  int64_t base_seq_len_, max_seq_len_;
  std::optional<double> mu_;
};

}  // namespace diffuse::schedulers
