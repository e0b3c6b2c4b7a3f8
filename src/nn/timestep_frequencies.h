// The frequencies of the sinusoidal timestep embedding, shared by get_timestep_embedding
// (nn/embeddings.h) and the ONNX export, which writes them into the graph as a constant so that
// an exported model embeds timesteps exactly as the engine does.
#pragma once
#include <torch/types.h>

#include <cstdint>

namespace diffuse::nn {

// exp(-log(max_period) * i / (half - shift)) for i < half, float32 on `device`.
torch::Tensor timestep_frequencies(int64_t half, double downscale_freq_shift, double max_period,
                                   const torch::Device& device);

}  // namespace diffuse::nn
