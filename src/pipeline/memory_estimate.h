// Sizes of activations for the memory plan (pipeline/memory_plan_folder.h) and the VAE's tiling
// policy, computed without overflow.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::pipeline {

// "1.5 GiB": bytes in GiB with one decimal, for messages.
std::string format_gib(int64_t bytes);

// The largest activation of a convolutional network's top level, `copies` of them at once:
// batch x channels x height x width x element size, computed without overflow (saturating).
int64_t activation_bytes(int64_t batch, int64_t channels, int64_t height, int64_t width,
                         int64_t element_bytes, int64_t copies);

}  // namespace diffuse::pipeline
