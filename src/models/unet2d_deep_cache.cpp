// DeepCache's two paths through UNet2DConditionModel (arXiv 2312.00858). Skip connections are
// numbered in the order the down path makes them (0 = conv_in's output); the up path consumes
// them in reverse. The shallow branch of (layer_id, block_id) makes skips 0..K, where K is
// that block's, and the up resnet that consumes skip K is where it re-enters: its input is
// the deep feature a full step records and the shallow steps reuse.
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "models/unet2d_condition.h"

namespace diffuse::models {
namespace {

struct Entry {
  size_t up_block = 0;  // the up block holding the consuming resnet
  size_t resnet = 0;    // its index there
};

}  // namespace

torch::Tensor UNet2DConditionModelImpl::forward_deep_cache(const torch::Tensor& sample_in,
                                                           const torch::Tensor& timestep,
                                                           const torch::Tensor& ehs, bool full,
                                                           UNetDeepCache& cache,
                                                           const UNetAddedConditions* added) {
  const std::string who = "UNet2DConditionModel (" + config_.source + "): DeepCache ";
  const auto layers = static_cast<int64_t>(down_list.size());
  if (cache.layer_id < 0 || cache.layer_id >= layers)
    throw InvalidArgument(who + "cache_layer_id " + std::to_string(cache.layer_id) +
                          " is outside [0, " + std::to_string(layers - 1) + "]");
  const auto layer = static_cast<size_t>(cache.layer_id);
  const auto outputs = static_cast<int64_t>(down_list[layer]->num_outputs());
  if (cache.block_id < 0 || cache.block_id >= outputs)
    throw InvalidArgument(who + "cache_block_id " + std::to_string(cache.block_id) +
                          " is outside [0, " + std::to_string(outputs - 1) + "] for down_blocks." +
                          std::to_string(layer));
  // Skip K (the cached block's), the total count, and the up resnet that pops skip K.
  size_t skip = 1 + static_cast<size_t>(cache.block_id), total = 1;
  for (size_t l = 0; l < down_list.size(); ++l) {
    if (l < layer) skip += down_list[l]->num_outputs();
    total += down_list[l]->num_outputs();
  }
  Entry entry;
  size_t pops = total - 1 - skip;  // skips the up path consumes before skip K
  for (; entry.up_block < up_list.size(); ++entry.up_block) {
    const size_t n = up_list[entry.up_block]->resnet_list.size();
    if (pops < n) break;
    pops -= n;
  }
  if (entry.up_block == up_list.size())
    throw InvalidArgument(who + "the up path does not consume skip connection " +
                          std::to_string(skip));
  entry.resnet = pops;

  auto [sample, emb, ctx] = prepare(sample_in, timestep, ehs, nullptr, added);
  nn::ResidualStack residuals{sample};
  auto& up = up_list[entry.up_block];
  if (full) {
    for (auto& block : down_list) sample = block(sample, emb, ctx, residuals);
    if (mid_block) sample = mid_block(sample, emb, ctx);
    for (size_t i = 0; i < entry.up_block; ++i) sample = up_list[i](sample, residuals, emb, ctx);
    sample = up->forward_range(sample, residuals, emb, ctx, 0, entry.resnet);
    cache.feature = sample;
  } else {
    for (size_t l = 0; l < layer; ++l) sample = down_list[l](sample, emb, ctx, residuals);
    sample = down_list[layer]->forward_prefix(sample, emb, ctx, residuals,
                                              static_cast<size_t>(cache.block_id) + 1);
    const auto& f = cache.feature;
    if (!f.defined() || f.size(0) != sample.size(0) || f.size(2) != residuals.back().size(2) ||
        f.size(3) != residuals.back().size(3))
      throw InvalidArgument(who +
                            "a shallow step needs the deep feature of a full step on the "
                            "same batch and size first");
    sample = f;
  }
  sample = up->forward_range(sample, residuals, emb, ctx, entry.resnet, up->resnet_list.size());
  for (size_t i = entry.up_block + 1; i < up_list.size(); ++i)
    sample = up_list[i](sample, residuals, emb, ctx);
  return output_head(sample, nullptr);
}

}  // namespace diffuse::models
