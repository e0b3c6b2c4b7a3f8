// A small HiDream transformer config shared by the test suites (other dimensions, block and
// expert counts than the golden set).
#pragma once
#include <nlohmann/json.hpp>

namespace diffuse::test {

inline nlohmann::json tiny_hidream_config() {
  return {{"_class_name", "HiDreamImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 4},
          {"num_layers", 1},
          {"num_single_layers", 2},
          {"attention_head_dim", 8},
          {"num_attention_heads", 3},
          {"caption_channels", {6, 10}},
          {"text_emb_dim", 5},
          {"num_routed_experts", 3},
          {"num_activated_experts", 2},
          {"axes_dims_rope", {4, 2, 2}},
          {"max_resolution", {8, 8}},
          {"llama_layers", {1, 0, 1}}};
}

}  // namespace diffuse::test
