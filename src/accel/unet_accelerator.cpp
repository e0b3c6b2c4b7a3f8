#include "accel/unet_accelerator.h"

#include "accel/dit_cache.h"

#include "accel/deepcache.h"
#include "diffuse/errors.h"
#include "nn/token_merge_hook.h"

namespace diffuse::accel {

namespace {

// A graph replays one whole, fixed call: DeepCache's shallow steps run another call, and token
// merging draws new destinations each step.
void validate_cuda_graph(const GenerationConfig& c) {
  if (!c.cuda_graph) return;
  if (c.deep_cache.interval > 1)
    throw InvalidArgument("--graph replays one recorded UNet call, DeepCache (--deepcache " +
                          std::to_string(c.deep_cache.interval) +
                          ") alternates two different calls: use one of them");
  if (c.token_merging.ratio > 0)
    throw InvalidArgument(
        "--graph replays one recorded UNet call, token merging (--tome) draws new merge "
        "destinations every step: use one of them");
}

// ControlNet residuals enter every skip connection of every step: DeepCache's shallow steps
// reuse a deep feature computed without this step's residuals, and a recorded graph holds one
// call's inputs.
void validate_controlnets(const GenerationConfig& c) {
  if (c.controlnets.empty()) return;
  if (c.deep_cache.interval > 1)
    throw InvalidArgument(
        "DeepCache (--deepcache) reuses deep features across steps, while ControlNet residuals "
        "change every skip connection each step: use one of them");
  if (c.cuda_graph)
    throw InvalidArgument(
        "--graph replays one recorded UNet call without ControlNet residuals: run ControlNets "
        "without --graph");
}

}  // namespace

void validate_accel_config(const GenerationConfig& c) {
  validate_controlnets(c);
  validate_deep_cache(c.deep_cache);
  validate_token_merging(c.token_merging);
  validate_dit_cache(c.dit_cache);
  validate_cuda_graph(c);
}

void validate_accel_config(const GenerationConfig& c, const models::UNet2DConditionConfig& unet) {
  validate_deep_cache(c.deep_cache, unet);
  validate_token_merging(c.token_merging);
  if (c.token_merging.ratio > 0) token_merging_sites(c.token_merging, unet);
  validate_cuda_graph(c);
}

UNetAccelerator::UNetAccelerator(const GenerationConfig& c,
                                 const models::UNet2DConditionConfig& unet, int64_t steps,
                                 uint64_t seed, UNetGraph* graph) {
  validate_accel_config(c, unet);
  if (c.deep_cache.interval > 1) {
    deep_cache_.emplace();
    deep_cache_->layer_id = c.deep_cache.layer_id;
    deep_cache_->block_id = c.deep_cache.block_id;
    full_ = deep_cache_full_steps(c.deep_cache, steps);
  }
  if (c.token_merging.ratio > 0)
    tome_ = std::make_unique<TokenMerging>(c.token_merging.ratio,
                                           token_merging_sites(c.token_merging, unet), seed);
  if (c.cuda_graph) {
    if (!graph) own_graph_ = std::make_unique<UNetGraph>();
    graph_ = graph ? graph : own_graph_.get();
  }
}

bool UNetAccelerator::full_step(int64_t step) const {
  if (!deep_cache_) return true;
  return step < 0 || step >= static_cast<int64_t>(full_.size()) || full_[static_cast<size_t>(step)];
}

torch::Tensor UNetAccelerator::forward(models::UNet2DConditionModelImpl& unet, int64_t step,
                                       const torch::Tensor& sample, const torch::Tensor& timestep,
                                       const torch::Tensor& context,
                                       const models::UNetAddedConditions* added,
                                       const models::UNetControlResiduals* control) {
  if (control && (graph_ || deep_cache_))
    throw InvalidArgument(
        "ControlNet residuals change every step's UNet input: they cannot run with " +
        std::string(graph_ ? "a replayed device graph (--graph)" : "DeepCache's shallow steps") +
        "; run without it");
  if (graph_) return graph_->forward(unet, sample, timestep, context, added);
  nn::ScopedTokenMergeHook hook(tome_.get());
  if (!deep_cache_) return unet.forward(sample, timestep, context, nullptr, added, control);
  return unet.forward_deep_cache(sample, timestep, context, full_step(step), *deep_cache_, added);
}

}  // namespace diffuse::accel
