// HiDreamTransformerConfig::from_json: every check names the file, the key and the value.
#include <numeric>
#include <string>

#include "diffuse/errors.h"
#include "models/config_values.h"
#include "models/hidream_transformer.h"

namespace diffuse::models {
namespace {

int64_t positive(const io::JsonConfig& cfg, const std::string& key, int64_t fallback) {
  return read_int_in(cfg, key, fallback, 1, kMaxConfigDim);
}

std::string list_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

HiDreamTransformerConfig HiDreamTransformerConfig::from_json(const io::JsonConfig& cfg) {
  HiDreamTransformerConfig c;
  c.source = cfg.source();
  if (!cfg.has("patch_size")) cfg.fail("patch_size", "is required");
  c.patch_size = read_int_in(cfg, "patch_size", 0, 1, 64);
  c.in_channels = positive(cfg, "in_channels", 64);
  c.out_channels = positive(cfg, "out_channels", c.in_channels);
  c.num_layers = read_int_in(cfg, "num_layers", 16, 0, kMaxConfigLayers);
  c.num_single_layers = read_int_in(cfg, "num_single_layers", 32, 0, kMaxConfigLayers);
  c.attention_head_dim = positive(cfg, "attention_head_dim", 128);
  c.num_attention_heads = positive(cfg, "num_attention_heads", 20);
  c.caption_channels = read_int_list(cfg, "caption_channels");
  if (c.caption_channels.size() != 2)
    cfg.fail("caption_channels",
             "expected [T5 channels, Llama channels], got " + list_string(c.caption_channels));
  c.text_emb_dim = positive(cfg, "text_emb_dim", 2048);

  c.num_routed_experts = read_int_in(cfg, "num_routed_experts", 4, 0, 1024);
  c.num_activated_experts = read_int_in(cfg, "num_activated_experts", 2, 0, 1024);
  if (c.num_routed_experts > 0 &&
      (c.num_activated_experts <= 0 || c.num_activated_experts > c.num_routed_experts))
    cfg.fail("num_activated_experts", std::to_string(c.num_activated_experts) +
                                          " experts per token, but there are " +
                                          std::to_string(c.num_routed_experts) +
                                          " routed experts (num_routed_experts): expected 1.." +
                                          std::to_string(c.num_routed_experts));

  if (cfg.has("axes_dims_rope")) c.axes_dims_rope = read_int_list(cfg, "axes_dims_rope");
  for (auto d : c.axes_dims_rope)
    if (d % 2 != 0)
      cfg.fail("axes_dims_rope", "every axis needs an even number of dimensions, got " +
                                     list_string(c.axes_dims_rope));
  const int64_t rope_dims =
      std::accumulate(c.axes_dims_rope.begin(), c.axes_dims_rope.end(), int64_t{0});
  // diffusers rotates the whole head, or (when the axes cover half of it) the first half.
  if (rope_dims != c.attention_head_dim && 2 * rope_dims != c.attention_head_dim)
    cfg.fail("axes_dims_rope", list_string(c.axes_dims_rope) + " sums to " +
                                   std::to_string(rope_dims) + "; expected attention_head_dim (" +
                                   std::to_string(c.attention_head_dim) + ") or half of it");

  if (cfg.has("max_resolution")) c.max_resolution = read_int_list(cfg, "max_resolution", 4096);
  if (c.max_resolution.size() != 2)
    cfg.fail("max_resolution", "expected [height, width], got " + list_string(c.max_resolution));
  if (c.max_seq() <= 0)
    cfg.fail("max_resolution", list_string(c.max_resolution) + " holds no " +
                                   std::to_string(c.patch_size) + "x" +
                                   std::to_string(c.patch_size) + " patch");

  c.llama_layers = cfg.require<std::vector<int64_t>>("llama_layers");
  const int64_t blocks = c.num_layers + c.num_single_layers;
  if (static_cast<int64_t>(c.llama_layers.size()) != blocks)
    cfg.fail("llama_layers", "has " + std::to_string(c.llama_layers.size()) +
                                 " entries; expected one per block (num_layers + "
                                 "num_single_layers = " +
                                 std::to_string(blocks) + ")");
  if (blocks == 0) cfg.fail("llama_layers", "the model has no blocks");
  for (auto l : c.llama_layers)
    if (l < 0) cfg.fail("llama_layers", "negative layer index in " + list_string(c.llama_layers));
  return c;
}

int64_t HiDreamTransformerConfig::max_seq() const {
  return max_resolution[0] * max_resolution[1] / (patch_size * patch_size);
}

}  // namespace diffuse::models
