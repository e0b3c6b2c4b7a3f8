// FLUX.1 transformers saved in Black Forest Labs' original layout (flux1-dev.safetensors,
// ComfyUI's model.diffusion_model.* files, city96's GGUFs): a mapping table onto the diffusers
// FluxTransformer2DModel this engine builds, not a second implementation. The fused tensors are
// taken apart by rows: a double block's img_attn.qkv / txt_attn.qkv into to_q/to_k/to_v and
// add_q/k/v_proj, a single block's linear1 into to_q/to_k/to_v/proj_mlp; the final layer's
// modulation gives (shift, scale) where diffusers' AdaLayerNormContinuous reads (scale, shift).
// Row counts come from the config (inner_dim, mlp_ratio), never from the file.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/flux_transformer.h"
#include "models/load_component.h"

namespace diffuse::models {

// Whether a transformer file's tensor names are BFL's ("double_blocks.0.img_attn.qkv.weight",
// optionally under "model.diffusion_model." or "diffusion_model.").
bool is_bfl_flux_layout(const std::vector<std::string>& file_keys);

// Every parameter of the diffusers model `config` describes, and where it is in a BFL-named
// file with these keys (the prefix the file uses is kept in the slices' keys). Tensors of the
// file no parameter reads are left to the loader, which names them as unexpected.
io::WeightLayout flux_bfl_layout(const std::vector<std::string>& file_keys,
                                 const FluxTransformerConfig& config);

// XLabs' LoRA names (x-flux's processors) as aliases of BFL modules, for adapters::Network:
// double_blocks.i.processor.{qkv,proj}_lora1 are img_attn.{qkv,proj}, ..._lora2 txt_attn's.
// (x-flux's single-block processors add to part of linear1 / linear2: not mapped.)
std::map<std::string, std::string> flux_xlabs_lora_aliases(const FluxTransformerConfig& config);

// For load_component_weights_to: the BFL layout when the file uses it, else none (diffusers names).
WeightLayoutFor flux_weight_layout_for(const FluxTransformerConfig& config);

}  // namespace diffuse::models
