#include "bench/unet_inputs.h"

#include <torch/torch.h>

#include "diffuse/errors.h"

namespace diffuse::bench {

std::optional<models::UNetAddedConditions> random_added_conditions(
    const models::UNet2DConditionConfig& unet, int64_t batch, int64_t height, int64_t width,
    at::Generator& gen, const torch::Device& device, torch::Dtype dtype) {
  if (!unet.text_time) return std::nullopt;
  constexpr int64_t kIds = 6;  // the base layout (a refiner's 5 would need its aesthetic score)
  const int64_t pooled =
      unet.projection_class_embeddings_input_dim - kIds * unet.addition_time_embed_dim;
  if (pooled < 1)
    throw ConfigError(unet.source + ": projection_class_embeddings_input_dim " +
                      std::to_string(unet.projection_class_embeddings_input_dim) +
                      " leaves no room for a pooled embedding beside " + std::to_string(kIds) +
                      " time ids of " + std::to_string(unet.addition_time_embed_dim));
  models::UNetAddedConditions a;
  a.text_embeds = torch::randn({batch, pooled}, gen, torch::TensorOptions().dtype(torch::kFloat32))
                      .to(device, dtype);
  const auto h = static_cast<float>(height), w = static_cast<float>(width);
  a.time_ids = torch::tensor({h, w, 0.0f, 0.0f, h, w}).repeat({batch, 1}).to(device);
  return a;
}

}  // namespace diffuse::bench
