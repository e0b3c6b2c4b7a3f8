#include "pipeline/controlnet_step.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "pipeline/control_image.h"

namespace diffuse::pipeline {

double ControlNetSteps::step_scale(const ControlNetStepUnit& u, int64_t i, int64_t n) {
  const double a = static_cast<double>(i) / n, b = static_cast<double>(i + 1) / n;
  return (a < u.start || b > u.end) ? 0.0 : u.scale;
}

models::UNetControlResiduals ControlNetSteps::run(
    int64_t i, int64_t n, const torch::Tensor& model_input, const torch::Tensor& timestep,
    const torch::Tensor& cond, const models::UNetAddedConditions* added, bool guidance,
    const std::function<void(const std::string&, const torch::Tensor&)>& trace) const {
  const bool cond_only = guess_mode_ && guidance;
  torch::Tensor x = model_input, ctx = cond;
  std::optional<models::UNetAddedConditions> added_half;
  if (cond_only) {
    x = model_input.chunk(2)[1];
    ctx = cond.chunk(2)[1];
    if (added) {
      added_half.emplace();
      added_half->text_embeds = added->text_embeds.chunk(2)[1];
      added_half->time_ids = added->time_ids.chunk(2)[1];
    }
  }
  const auto* add = cond_only ? (added_half ? &*added_half : nullptr) : added;
  if (trace) trace("step." + std::to_string(i) + ".controlnet_input", x);
  models::UNetControlResiduals sum;
  for (size_t j = 0; j < units_.size(); ++j) {
    const auto& u = units_[j];
    const double s = step_scale(u, i, n);
    if (trace)
      trace(
          "step." + std::to_string(i) + ".controlnet." + std::to_string(j) + ".conditioning_scale",
          torch::tensor(s, torch::kFloat64));
    const auto image = u.image.expand({x.size(0), -1, -1, -1});
    auto r = u.net->forward(x, timestep, ctx, image, s, guess_mode_, nullptr, add);
    if (j == 0) {
      sum = std::move(r);
    } else {
      for (size_t k = 0; k < sum.down.size(); ++k) sum.down[k] = sum.down[k] + r.down[k];
      sum.mid = sum.mid + r.mid;
    }
  }
  if (cond_only) {
    for (auto& d : sum.down) d = torch::cat({torch::zeros_like(d), d});
    sum.mid = torch::cat({torch::zeros_like(sum.mid), sum.mid});
  }
  return sum;
}

void check_controlnet_fits(const models::ControlNetConfig& net,
                           const models::UNet2DConditionConfig& unet, int64_t vae_factor,
                           const std::string& path) {
  const auto& c = net.unet;
  const auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  const auto refuse = [&](const std::string& what, const std::string& a, const std::string& b) {
    throw InvalidArgument("ControlNet " + path + " does not fit the UNet: its " + what + " is " +
                          a + ", the UNet's " + b);
  };
  if (c.block_out_channels != unet.block_out_channels)
    refuse("block_out_channels", list(c.block_out_channels), list(unet.block_out_channels));
  if (c.layers_per_block != unet.layers_per_block)
    refuse("layers_per_block", list(c.layers_per_block), list(unet.layers_per_block));
  if (c.cross_attention_dim.front() != unet.cross_attention_dim.front())
    refuse("cross_attention_dim", std::to_string(c.cross_attention_dim.front()),
           std::to_string(unet.cross_attention_dim.front()));
  if (c.text_time != unet.text_time)
    refuse("added conditioning (addition_embed_type)", c.text_time ? "text_time" : "none",
           unet.text_time ? "text_time" : "none");
  if (c.in_channels != 4 && c.in_channels != unet.in_channels)
    refuse("in_channels", std::to_string(c.in_channels), std::to_string(unet.in_channels));
  if (net.condition_factor() != vae_factor)
    refuse("conditioning embedding's downscaling (2^(levels - 1))",
           std::to_string(net.condition_factor()), "VAE factor " + std::to_string(vae_factor));
}

void validate_controlnet_units(const std::vector<ControlNetUnit>& units) {
  for (size_t j = 0; j < units.size(); ++j) {
    const auto& u = units[j];
    const std::string who = "ControlNet " + std::to_string(j + 1) + " (" + u.model + "): ";
    if (u.model.empty())
      throw InvalidArgument("ControlNet " + std::to_string(j + 1) + ": no model given");
    if (!u.image.defined()) throw InvalidArgument(who + "no control image given (--control-image)");
    validate_control_preprocessor(u.preprocess);
    if (!std::isfinite(u.scale))
      throw InvalidArgument(who + "scale must be a finite number, got " + std::to_string(u.scale));
    if (!(u.start >= 0 && u.start < u.end && u.end <= 1))
      throw InvalidArgument(who + "start and end must satisfy 0 <= start < end <= 1, got " +
                            std::to_string(u.start) + " and " + std::to_string(u.end));
  }
}

}  // namespace diffuse::pipeline
