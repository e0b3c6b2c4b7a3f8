#include "accel/deepcache.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "diffuse/errors.h"

namespace diffuse::accel {

void validate_deep_cache(const DeepCacheOptions& o) {
  if (o.interval < 1)
    throw InvalidArgument("deepcache interval (cache_interval): got " + std::to_string(o.interval) +
                          ", expected an integer >= 1 (1 = off, N = a full UNet step every N)");
  if (o.layer_id < 0)
    throw InvalidArgument("deepcache layer id (cache_layer_id): got " + std::to_string(o.layer_id) +
                          ", expected a down block index >= 0");
  if (o.block_id < 0)
    throw InvalidArgument("deepcache block id (cache_block_id): got " + std::to_string(o.block_id) +
                          ", expected a block index >= 0");
}

void validate_deep_cache(const DeepCacheOptions& o, const models::UNet2DConditionConfig& unet) {
  validate_deep_cache(o);
  if (o.interval == 1) return;
  const auto blocks = static_cast<int>(unet.down_block_types.size());
  if (o.layer_id >= blocks)
    throw InvalidArgument("deepcache layer id (cache_layer_id): got " + std::to_string(o.layer_id) +
                          ", expected 0.." + std::to_string(blocks - 1) + " (this UNet has " +
                          std::to_string(blocks) + " down blocks, " + unet.source + ")");
  const auto layer = static_cast<size_t>(o.layer_id);
  const int pairs = static_cast<int>(unet.layers_per_block[layer]);
  const int outputs = pairs + (o.layer_id < blocks - 1 ? 1 : 0);
  if (o.block_id >= outputs)
    throw InvalidArgument(
        "deepcache block id (cache_block_id): got " + std::to_string(o.block_id) +
        ", expected 0.." + std::to_string(outputs - 1) + " for down_blocks." +
        std::to_string(o.layer_id) + " (" + std::to_string(pairs) + " resnet blocks" +
        (outputs > pairs ? ", then its downsampler as block " + std::to_string(pairs) : "") + ")");
}

std::vector<bool> deep_cache_full_steps(const DeepCacheOptions& o, int64_t steps) {
  std::vector<bool> full(static_cast<size_t>(std::max<int64_t>(steps, 0)), o.interval <= 1);
  if (o.interval <= 1 || steps <= 0) return full;
  const int64_t count = (steps + o.interval - 1) / o.interval;
  if (!o.non_uniform) {
    for (int64_t i = 0; i < steps; i += o.interval) full[static_cast<size_t>(i)] = true;
    return full;
  }
  int64_t previous = -1;
  for (int64_t k = 0; k < count; ++k) {
    const double x =
        std::pow(static_cast<double>(k) / static_cast<double>(count), kNonUniformPower);
    // At least one past the previous (early positions crowd together), and room left for the
    // full steps still to come.
    int64_t at = std::max(previous + 1, static_cast<int64_t>(std::floor(x * steps)));
    at = std::min(at, steps - (count - k));
    full[static_cast<size_t>(at)] = true;
    previous = at;
  }
  return full;
}

}  // namespace diffuse::accel
