#include "models/flux_bfl_names.h"

#include <algorithm>

#include "io/string_affixes.h"

namespace diffuse::models {
namespace {

// The prefixes single-file FLUX checkpoints put before BFL's names.
const char* const kPrefixes[] = {"model.diffusion_model.", "diffusion_model.", ""};

std::string file_prefix(const std::vector<std::string>& keys) {
  for (const char* p : kPrefixes)
    for (const auto& k : keys)
      if (io::starts_with(k, std::string(p) + "double_blocks.") ||
          io::starts_with(k, std::string(p) + "single_blocks.") ||
          io::starts_with(k, std::string(p) + "img_in."))
        return p;
  return {};
}

// One row of the table: a diffusers module (a linear layer unless `norm`) and the BFL tensor it
// reads, with the rows it takes of it.
struct Entry {
  std::string module;  // diffusers name, without ".weight"
  std::string bfl;     // BFL name, without ".weight" / ".scale"
  int64_t row_begin = 0, rows = -1;
  bool swap_halves = false;
  bool norm = false;  // an RMSNorm: BFL's ".scale" is diffusers' ".weight", no bias
};

void add(io::WeightLayout& layout, const std::string& prefix, const Entry& e) {
  if (e.norm) {
    layout[e.module + ".weight"] = {prefix + e.bfl + ".scale", e.row_begin, e.rows, e.swap_halves};
    return;
  }
  for (const char* p : {".weight", ".bias"})
    layout[e.module + p] = {prefix + e.bfl + p, e.row_begin, e.rows, e.swap_halves};
}

// `count` blocks: each entry's names under "<diffusers>.<i>." and "<bfl>.<i>.".
void add_blocks(io::WeightLayout& layout, const std::string& prefix, int64_t count,
                const std::string& diffusers, const std::string& bfl,
                const std::vector<Entry>& entries) {
  for (int64_t i = 0; i < count; ++i) {
    const std::string n = std::to_string(i) + ".";
    for (auto e : entries) {
      e.module = diffusers + n + e.module;
      e.bfl = bfl + n + e.bfl;
      add(layout, prefix, e);
    }
  }
}

}  // namespace

bool is_bfl_flux_layout(const std::vector<std::string>& file_keys) {
  const std::string p = file_prefix(file_keys);
  return std::any_of(file_keys.begin(), file_keys.end(), [&](const std::string& k) {
    return io::starts_with(k, p + "double_blocks.") || io::starts_with(k, p + "single_blocks.");
  });
}

io::WeightLayout flux_bfl_layout(const std::vector<std::string>& file_keys,
                                 const FluxTransformerConfig& c) {
  const std::string p = file_prefix(file_keys);
  const int64_t inner = c.inner_dim();
  const auto mlp = static_cast<int64_t>(static_cast<double>(inner) * c.block_options().mlp_ratio);
  io::WeightLayout layout;
  const std::vector<Entry> top = {
      {"x_embedder", "img_in"},
      {"context_embedder", "txt_in"},
      {"time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"},
      {"time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"},
      {"time_text_embed.text_embedder.linear_1", "vector_in.in_layer"},
      {"time_text_embed.text_embedder.linear_2", "vector_in.out_layer"},
      {"proj_out", "final_layer.linear"},
      // BFL's final modulation is (shift, scale); AdaLayerNormContinuous reads (scale, shift).
      {"norm_out.linear", "final_layer.adaLN_modulation.1", 0, -1, /*swap_halves=*/true},
  };
  for (const auto& e : top) add(layout, p, e);
  if (c.guidance_embeds) {
    add(layout, p, {"time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"});
    add(layout, p, {"time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"});
  }
  const std::vector<Entry> double_block = {
      {"norm1.linear", "img_mod.lin"},
      {"norm1_context.linear", "txt_mod.lin"},
      {"attn.to_q", "img_attn.qkv", 0, inner},
      {"attn.to_k", "img_attn.qkv", inner, inner},
      {"attn.to_v", "img_attn.qkv", 2 * inner, inner},
      {"attn.norm_q", "img_attn.norm.query_norm", 0, -1, false, /*norm=*/true},
      {"attn.norm_k", "img_attn.norm.key_norm", 0, -1, false, true},
      {"attn.to_out.0", "img_attn.proj"},
      {"attn.add_q_proj", "txt_attn.qkv", 0, inner},
      {"attn.add_k_proj", "txt_attn.qkv", inner, inner},
      {"attn.add_v_proj", "txt_attn.qkv", 2 * inner, inner},
      {"attn.norm_added_q", "txt_attn.norm.query_norm", 0, -1, false, true},
      {"attn.norm_added_k", "txt_attn.norm.key_norm", 0, -1, false, true},
      {"attn.to_add_out", "txt_attn.proj"},
      {"ff.net.0.proj", "img_mlp.0"},
      {"ff.net.2", "img_mlp.2"},
      {"ff_context.net.0.proj", "txt_mlp.0"},
      {"ff_context.net.2", "txt_mlp.2"},
  };
  add_blocks(layout, p, c.num_layers, "transformer_blocks.", "double_blocks.", double_block);
  // linear1 holds q, k, v and the MLP's input projection, in that order.
  const std::vector<Entry> single_block = {
      {"norm.linear", "modulation.lin"},
      {"attn.to_q", "linear1", 0, inner},
      {"attn.to_k", "linear1", inner, inner},
      {"attn.to_v", "linear1", 2 * inner, inner},
      {"proj_mlp", "linear1", 3 * inner, mlp},
      {"attn.norm_q", "norm.query_norm", 0, -1, false, true},
      {"attn.norm_k", "norm.key_norm", 0, -1, false, true},
      {"proj_out", "linear2"},
  };
  add_blocks(layout, p, c.num_single_layers, "single_transformer_blocks.", "single_blocks.",
             single_block);
  return layout;
}

WeightLayoutFor flux_weight_layout_for(const FluxTransformerConfig& config) {
  return [config](const std::vector<std::string>& keys) -> std::optional<io::WeightLayout> {
    if (!is_bfl_flux_layout(keys)) return std::nullopt;
    return flux_bfl_layout(keys, config);
  };
}

std::map<std::string, std::string> flux_xlabs_lora_aliases(const FluxTransformerConfig& config) {
  std::map<std::string, std::string> aliases;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string block = "double_blocks." + std::to_string(i) + ".";
    aliases[block + "processor.qkv_lora1"] = block + "img_attn.qkv";
    aliases[block + "processor.proj_lora1"] = block + "img_attn.proj";
    aliases[block + "processor.qkv_lora2"] = block + "txt_attn.qkv";
    aliases[block + "processor.proj_lora2"] = block + "txt_attn.proj";
  }
  return aliases;
}

}  // namespace diffuse::models
