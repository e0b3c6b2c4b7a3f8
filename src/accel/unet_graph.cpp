#include "accel/unet_graph.h"

#include "diffuse/errors.h"

namespace diffuse::accel {
namespace {

bool same_layout(const torch::Tensor& held, const torch::Tensor& given, const torch::Device& on) {
  if (held.defined() != given.defined()) return false;
  if (!given.defined()) return true;
  return held.sizes() == given.sizes() && held.scalar_type() == given.scalar_type() &&
         held.device() == on;
}

// A device copy the graph reads from; the caller's values are copied in before each replay.
torch::Tensor static_copy(const torch::Tensor& t, const torch::Device& on) {
  return t.defined() ? t.to(on, /*non_blocking=*/false, /*copy=*/true) : t;
}

void copy_into(torch::Tensor& held, const torch::Tensor& given) {
  if (given.defined()) held.copy_(given);
}

std::vector<const void*> weight_addresses(const models::UNet2DConditionModelImpl& unet) {
  std::vector<const void*> out;
  for (const auto& p : unet.parameters()) out.push_back(p.data_ptr());
  for (const auto& b : unet.buffers()) out.push_back(b.data_ptr());
  return out;
}

}  // namespace

bool UNetGraph::fits(const models::UNet2DConditionModelImpl& unet, const torch::Tensor& sample,
                     const torch::Tensor& timestep, const torch::Tensor& context,
                     const models::UNetAddedConditions* added) const {
  if (!graph_.captured() || !sample_.defined() || unet_ != &unet ||
      weights_ != weight_addresses(unet))
    return false;
  const auto on = sample_.device();
  if (sample.device() != on || !same_layout(sample_, sample, on) ||
      !same_layout(timestep_, timestep, on) || !same_layout(context_, context, on))
    return false;
  if (static_cast<bool>(added) != added_.has_value()) return false;
  return !added || (same_layout(added_->text_embeds, added->text_embeds, on) &&
                    same_layout(added_->time_ids, added->time_ids, on));
}

void UNetGraph::reset() {
  graph_.reset();
  unet_ = nullptr;
  weights_.clear();
  sample_ = timestep_ = context_ = out_ = torch::Tensor();
  added_.reset();
}

torch::Tensor UNetGraph::forward(models::UNet2DConditionModelImpl& unet,
                                 const torch::Tensor& sample, const torch::Tensor& timestep,
                                 const torch::Tensor& context,
                                 const models::UNetAddedConditions* added) {
  const auto on = sample.device();
  if (!device::DeviceGraph::available(on))
    throw InvalidArgument(
        "--graph (graph replay of the UNet step) needs a CUDA device or an npu whose backend "
        "captures graphs: " +
        device::DeviceGraph::unavailable_reason(on));
  if (!fits(unet, sample, timestep, context, added)) {
    graph_.reset();
    unet_ = &unet;
    weights_ = weight_addresses(unet);
    sample_ = static_copy(sample, on);
    timestep_ = static_copy(timestep, on);
    context_ = static_copy(context, on);
    added_.reset();
    if (added) {
      added_.emplace();
      added_->text_embeds = static_copy(added->text_embeds, on);
      added_->time_ids = static_copy(added->time_ids, on);
    }
    // Holds the network, not this frame: a backend may keep the call for its replays.
    graph_.capture(on, [this, u = &unet] {
      out_ = u->forward(sample_, timestep_, context_, nullptr, added_ ? &*added_ : nullptr);
    });
    ++captures_;
  }
  copy_into(sample_, sample);
  copy_into(timestep_, timestep);
  copy_into(context_, context);
  if (added) {
    copy_into(added_->text_embeds, added->text_embeds);
    copy_into(added_->time_ids, added->time_ids);
  }
  graph_.replay();
  return out_.clone();
}

}  // namespace diffuse::accel
