#include "schedulers/scheduler.h"

#include <torch/torch.h>

#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::schedulers {

Scheduler::~Scheduler() = default;

Scheduler::Scheduler(std::string source, torch::Tensor alphas_cumprod)
    : source_(std::move(source)),
      num_train_timesteps_(alphas_cumprod.size(0)),
      alphas_cumprod_(std::move(alphas_cumprod)) {}

Scheduler::Scheduler(std::string source, int64_t num_train_timesteps)
    : source_(std::move(source)), num_train_timesteps_(num_train_timesteps) {}

void Scheduler::check_num_inference_steps(int n) const {
  if (n < 1 || n > num_train_timesteps_) {
    throw InvalidArgument(std::string(class_name()) + ": num_inference_steps must be in [1, " +
                          std::to_string(num_train_timesteps_) + "] (num_train_timesteps of " +
                          source_ + "), got " + std::to_string(n));
  }
}

void Scheduler::require_timesteps(const char* what) const {
  if (num_inference_steps_ == 0)
    throw InvalidArgument(std::string(class_name()) + "::" + what +
                          ": call set_timesteps(num_inference_steps) first");
}

int64_t Scheduler::index_for_timestep(const torch::Tensor& timestep, bool missing_is_last) const {
  if (timestep.numel() != 1)
    throw InvalidArgument(std::string(class_name()) + ": expected a single timestep, got " +
                          std::to_string(timestep.numel()) + " values");
  auto t = timestep.detach().to(torch::kCPU).reshape({});
  auto matches = timesteps_.eq(t).nonzero();
  const int64_t count = matches.size(0);
  if (count == 0) {
    if (missing_is_last) return timesteps_.size(0) - 1;
    std::ostringstream os;
    os << class_name() << ": timestep " << t.item<double>()
       << " is not in the schedule set by set_timesteps(" << num_inference_steps_ << ")";
    throw InvalidArgument(os.str());
  }
  // For img2img the first timestep may occur twice; diffusers then takes the second match so
  // that no sigma is skipped when starting in the middle of the schedule.
  return matches[count > 1 ? 1 : 0][0].item<int64_t>();
}

void Scheduler::init_step_index(const torch::Tensor& timestep, bool missing_is_last) {
  if (step_index_) return;
  step_index_ = begin_index_ ? *begin_index_ : index_for_timestep(timestep, missing_is_last);
}

std::vector<int64_t> Scheduler::noise_step_indices(const torch::Tensor& timesteps,
                                                   bool missing_is_last) const {
  require_timesteps("add_noise");
  auto flat = timesteps.detach().to(torch::kCPU).reshape({-1});
  std::vector<int64_t> out;
  for (int64_t i = 0; i < flat.size(0); ++i) {
    if (!begin_index_)
      out.push_back(index_for_timestep(flat[i], missing_is_last));
    else
      out.push_back(step_index_ ? *step_index_ : *begin_index_);
  }
  for (int64_t idx : out)
    if (idx < 0 || idx >= sigmas_.size(0))
      throw InvalidArgument(std::string(class_name()) + ": step index " + std::to_string(idx) +
                            " is outside the schedule");
  return out;
}

float Scheduler::sigma_at(int64_t index) const {
  if (index < 0 || index >= sigmas_.size(0))
    throw InvalidArgument(std::string(class_name()) + ": step index " + std::to_string(index) +
                          " is past the end of the schedule (" +
                          std::to_string(sigmas_.size(0) - 1) + " steps)");
  return sigmas_.data_ptr<float>()[index];
}

float Scheduler::alpha_cumprod_at(int64_t t) const {
  if (t < 0 || t >= num_train_timesteps_)
    throw InvalidArgument(std::string(class_name()) + ": timestep " + std::to_string(t) +
                          " is outside [0, " + std::to_string(num_train_timesteps_) + ")");
  return alphas_cumprod_.data_ptr<float>()[t];
}

}  // namespace diffuse::schedulers
