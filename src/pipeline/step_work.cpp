#include "pipeline/step_work.h"

#include <algorithm>

namespace diffuse::pipeline {
namespace {

bool has_attention(const std::string& block_type) {
  return block_type.find("CrossAttn") != std::string::npos;
}

}  // namespace

double unet_step_flops(const models::UNet2DConditionConfig& c, int64_t parameters, int64_t batch,
                       int64_t latent_height, int64_t latent_width) {
  const double B = static_cast<double>(batch);
  const size_t levels = c.block_out_channels.size();
  // The weights' work: a weight runs once per position of its level, and a level's share of
  // the weights grows with its channels squared.
  double weighted_positions = 0, weights = 0;
  for (size_t l = 0; l < levels; ++l) {
    const double ch = static_cast<double>(c.block_out_channels[l]);
    weighted_positions += ch * ch * static_cast<double>((latent_height >> l) * (latent_width >> l));
    weights += ch * ch;
  }
  double flops =
      weights > 0 ? 2 * B * static_cast<double>(parameters) * weighted_positions / weights : 0;
  // q k^T and p v of the self-attentions: 4 x positions^2 x channels per transformer layer.
  auto self_attention = [&](size_t level, double transformers) {
    const double h = static_cast<double>(latent_height >> level);
    const double w = static_cast<double>(latent_width >> level);
    const double layers =
        level < c.transformer_layers_per_block.size() ? c.transformer_layers_per_block[level] : 1;
    flops += 4 * B * (h * w) * (h * w) * static_cast<double>(c.block_out_channels[level]) *
             transformers * layers;
  };
  for (size_t i = 0; i < levels && i < c.down_block_types.size(); ++i) {
    const double per_block = i < c.layers_per_block.size() ? c.layers_per_block[i] : 1;
    if (has_attention(c.down_block_types[i])) self_attention(i, per_block);
    // The up path runs its levels in reverse, with one block more per level.
    const size_t up = levels - 1 - i;
    if (i < c.up_block_types.size() && has_attention(c.up_block_types[i]))
      self_attention(up, (up < c.layers_per_block.size() ? c.layers_per_block[up] : 1) + 1);
  }
  if (levels > 0 && has_attention(c.mid_block_type)) self_attention(levels - 1, 1);
  return flops;
}

}  // namespace diffuse::pipeline
