#include "models/qwen2_5_vl.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "io/string_affixes.h"
#include "models/config_values.h"
#include "nn/attention.h"
#include "nn/load_weights.h"

namespace diffuse::models {
namespace {

constexpr double kVisionNormEps = 1e-6;
constexpr double kVisionRopeTheta = 10000.0;

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

Qwen2_5_VLVisionConfig vision_from_json(const io::JsonConfig& v) {
  Qwen2_5_VLVisionConfig c;
  c.depth = read_int_in(v, "depth", c.depth, 1, kMaxConfigLayers);
  c.hidden_size = read_int_in(v, "hidden_size", c.hidden_size, 1, kMaxConfigDim);
  c.intermediate_size = read_int_in(v, "intermediate_size", c.intermediate_size, 1, kMaxConfigDim);
  c.num_heads = read_int_in(v, "num_heads", c.num_heads, 1, kMaxConfigDim);
  c.in_channels = read_int_in(v, "in_channels", v.get<int64_t>("in_chans", 3), 1, 16);
  c.patch_size = read_int_in(v, "patch_size", v.get<int64_t>("spatial_patch_size", 14), 1, 1024);
  c.temporal_patch_size = read_int_in(v, "temporal_patch_size", c.temporal_patch_size, 1, 64);
  c.spatial_merge_size = read_int_in(v, "spatial_merge_size", c.spatial_merge_size, 1, 64);
  c.window_size = read_int_in(v, "window_size", c.window_size, 1, 1 << 16);
  c.out_hidden_size = read_int_in(v, "out_hidden_size", c.out_hidden_size, 1, kMaxConfigDim);
  if (v.has("fullatt_block_indexes"))
    c.fullatt_block_indexes = read_int_list(v, "fullatt_block_indexes", kMaxConfigLayers);
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    v.fail("num_heads", "hidden_size " + std::to_string(c.hidden_size) + " / " +
                            std::to_string(c.num_heads) +
                            " heads must be a multiple of 4 (2D rotary positions)");
  if (v.get<std::string>("hidden_act", "silu") != "silu")
    v.fail("hidden_act",
           "unsupported '" + v.get<std::string>("hidden_act", "") + "' (expected silu)");
  const int64_t merge_window = c.window_size / (c.spatial_merge_size * c.patch_size);
  if (merge_window < 1)
    v.fail("window_size", std::to_string(c.window_size) + " is smaller than one merged patch (" +
                              std::to_string(c.spatial_merge_size * c.patch_size) + " pixels)");
  return c;
}

}  // namespace

Qwen2_5_VLConfig Qwen2_5_VLConfig::from_json(const io::JsonConfig& cfg) {
  Qwen2_5_VLConfig c;
  c.source = cfg.source();
  // Text keys at the top (transformers <= 4.52) or under text_config (later versions).
  nlohmann::json text = cfg.json();
  if (cfg.has("text_config")) {
    if (!cfg.json()["text_config"].is_object()) cfg.fail("text_config", "expected an object");
    text = cfg.json()["text_config"];
  }
  nlohmann::json rope_scaling = text.value("rope_scaling", nlohmann::json());
  if (rope_scaling.is_null()) rope_scaling = cfg.json().value("rope_scaling", nlohmann::json());
  // Qwen2: biases on q/k/v only; mRoPE handled here, not by the Llama config reader.
  text.erase("rope_scaling");
  text["attention_bias"] = true;
  if (!text.contains("hidden_act")) text["hidden_act"] = "silu";
  c.text = LlamaConfig::from_json(io::JsonConfig(text, c.source));
  c.text.o_proj_bias = false;
  if (!rope_scaling.is_object() || !rope_scaling.contains("mrope_section"))
    cfg.fail("rope_scaling",
             "expected an object with mrope_section (Qwen2.5-VL's multimodal "
             "rotary sections)");
  const io::JsonConfig rs(rope_scaling, c.source + ": rope_scaling");
  const auto section = read_int_list(rs, "mrope_section", kMaxConfigDim);
  if (section.size() != 3 || section[0] + section[1] + section[2] != c.text.head_dim / 2 ||
      std::any_of(section.begin(), section.end(), [](int64_t s) { return s < 0; }))
    rs.fail("mrope_section", list_text(section) +
                                 ": expected 3 non-negative sections (t, h, w) summing to head_dim "
                                 "/ 2 = " +
                                 std::to_string(c.text.head_dim / 2));
  c.mrope_section = {section[0], section[1], section[2]};
  const std::string type = rs.get<std::string>("rope_type", rs.get<std::string>("type", "default"));
  if (type != "default" && type != "mrope")
    rs.fail("rope_type", "unsupported '" + type + "' (expected default or mrope)");
  c.image_token_id = read_int_in(cfg, "image_token_id", c.image_token_id, 0, kMaxConfigVocab);
  c.vision_start_token_id =
      read_int_in(cfg, "vision_start_token_id", c.vision_start_token_id, 0, kMaxConfigVocab);
  c.has_vision = cfg.has("vision_config");
  if (c.has_vision) {
    if (!cfg.json()["vision_config"].is_object()) cfg.fail("vision_config", "expected an object");
    c.vision =
        vision_from_json(io::JsonConfig(cfg.json()["vision_config"], c.source + ": vision_config"));
    if (c.vision.out_hidden_size != c.text.hidden_size)
      cfg.fail("vision_config", "out_hidden_size " + std::to_string(c.vision.out_hidden_size) +
                                    " differs from the language model's hidden_size " +
                                    std::to_string(c.text.hidden_size));
    for (auto i : c.vision.fullatt_block_indexes)
      if (i < 0 || i >= c.vision.depth)
        cfg.fail("vision_config",
                 "fullatt_block_indexes " + list_text(c.vision.fullatt_block_indexes) +
                     " names a block outside depth " + std::to_string(c.vision.depth));
  }
  return c;
}

Qwen2_5_VisionTransformerImpl::Qwen2_5_VisionTransformerImpl(const Qwen2_5_VLVisionConfig& c)
    : config(c) {
  auto patch_embed = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  auto patch_proj = patch_embed->register_module("proj", std::make_shared<torch::nn::Module>());
  patch_weight = patch_proj->register_parameter(
      "weight",
      torch::empty(
          {c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}),
      /*requires_grad=*/false);
  LlamaConfig mlp_config;
  mlp_config.hidden_size = c.hidden_size;
  mlp_config.intermediate_size = c.intermediate_size;
  mlp_config.mlp_bias = true;
  auto blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.depth; ++i) {
    auto block = std::make_shared<torch::nn::Module>();
    norm1.push_back(block->register_module("norm1", LlamaRMSNorm(c.hidden_size, kVisionNormEps)));
    norm2.push_back(block->register_module("norm2", LlamaRMSNorm(c.hidden_size, kVisionNormEps)));
    auto attn = block->register_module("attn", std::make_shared<torch::nn::Module>());
    qkv.push_back(attn->register_module("qkv", nn::make_linear(c.hidden_size, 3 * c.hidden_size)));
    proj.push_back(attn->register_module("proj", nn::make_linear(c.hidden_size, c.hidden_size)));
    mlp.push_back(block->register_module("mlp", LlamaMLP(mlp_config)));
    blocks->push_back(block);
  }
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  const int64_t merged = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  ln_q = merger->register_module("ln_q", LlamaRMSNorm(c.hidden_size, kVisionNormEps));
  auto merger_mlp = merger->register_module("mlp", std::make_shared<torch::nn::Module>());
  merger_fc1 = merger_mlp->register_module("0", nn::make_linear(merged, merged));
  merger_fc2 = merger_mlp->register_module("2", nn::make_linear(merged, c.out_hidden_size));
}

torch::Tensor Qwen2_5_VisionTransformerImpl::forward(const torch::Tensor& pixel_values,
                                                     const std::array<int64_t, 3>& grid) {
  const auto& c = config;
  const int64_t t = grid[0], gh = grid[1], gw = grid[2], M = c.spatial_merge_size;
  const int64_t patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  if (t < 1 || gh < 1 || gw < 1 || gh % M != 0 || gw % M != 0)
    throw InvalidArgument("Qwen2.5-VL vision tower: image grid (" + std::to_string(t) + ", " +
                          std::to_string(gh) + ", " + std::to_string(gw) +
                          ") must be positive with h and w multiples of spatial_merge_size " +
                          std::to_string(M));
  const int64_t N = t * gh * gw, unit = M * M;
  if (pixel_values.dim() != 2 || pixel_values.size(0) != N || pixel_values.size(1) != patch_dim)
    throw InvalidArgument("Qwen2.5-VL vision tower: pixel_values must be [" + std::to_string(N) +
                          ", " + std::to_string(patch_dim) + "] for that grid, got " +
                          c10::str(pixel_values.sizes()));
  const auto dev = patch_weight.device();
  const auto dtype = patch_weight.scalar_type();
  // The Conv3d with kernel = stride over one patch each is a matrix product.
  auto h = torch::matmul(pixel_values.to(dev, dtype), patch_weight.view({c.hidden_size, -1}).t());

  // 2D rotary positions: (row, col) of each patch, in merge-window order.
  auto rows = torch::arange(gh).view({gh, 1}).expand({gh, gw});
  auto cols = torch::arange(gw).view({1, gw}).expand({gh, gw});
  auto order = [&](const torch::Tensor& p) {
    return p.reshape({gh / M, M, gw / M, M}).permute({0, 2, 1, 3}).flatten().repeat({t});
  };
  const int64_t rot = c.head_dim() / 2;  // Qwen2_5_VisionRotaryEmbedding(head_dim / 2)
  auto inv_freq =
      1.0 / torch::pow(kVisionRopeTheta, torch::arange(0, rot, 2, torch::kFloat32) / rot);
  auto max_side = std::max(gh, gw);
  auto table = torch::outer(torch::arange(max_side, torch::kFloat32), inv_freq);
  auto freqs = torch::cat({table.index_select(0, order(rows)), table.index_select(0, order(cols))},
                          1);  // [N, head_dim / 2]

  // Window attention: windows of window_size pixels over the merged grid, tokens reordered so
  // that each window is contiguous.
  const int64_t vw = c.window_size / M / c.patch_size;
  const int64_t lh = gh / M, lw = gw / M;
  const int64_t pad_h = vw - lh % vw, pad_w = vw - lw % vw;
  const int64_t nwh = (lh + pad_h) / vw, nww = (lw + pad_w) / vw;
  std::vector<int64_t> window_index;
  std::vector<int64_t> window_bounds{0};
  for (int64_t f = 0; f < t; ++f)
    for (int64_t wy = 0; wy < nwh; ++wy)
      for (int64_t wx = 0; wx < nww; ++wx) {
        int64_t count = 0;
        for (int64_t y = wy * vw; y < std::min((wy + 1) * vw, lh); ++y)
          for (int64_t x = wx * vw; x < std::min((wx + 1) * vw, lw); ++x, ++count)
            window_index.push_back(f * lh * lw + y * lw + x);
        if (count) window_bounds.push_back(window_bounds.back() + count * unit);
      }
  const auto index = torch::tensor(window_index, torch::kInt64);
  auto by_window = [&](const torch::Tensor& x) {
    return x.reshape({N / unit, unit, -1}).index_select(0, index.to(x.device())).reshape({N, -1});
  };
  h = by_window(h);
  auto emb = by_window(freqs);
  emb = torch::cat({emb, emb}, -1).to(dev);
  const auto cos = emb.cos().unsqueeze(1), sin = emb.sin().unsqueeze(1);  // [N, 1, head_dim]
  std::vector<int64_t> frame_bounds;
  for (int64_t f = 0; f <= t; ++f) frame_bounds.push_back(f * gh * gw);

  const int64_t H = c.num_heads, D = c.head_dim();
  for (int64_t i = 0; i < c.depth; ++i) {
    const bool full = std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                i) != c.fullatt_block_indexes.end();
    const auto& bounds = full ? frame_bounds : window_bounds;
    auto x = norm1[i](h);
    auto q_k_v = qkv[i](x).view({N, 3, H, D}).unbind(1);
    // Rotary in float32 (apply_rotary_pos_emb_vision), back to the model's dtype.
    auto q = (q_k_v[0].to(torch::kFloat32) * cos + rotate_half(q_k_v[0].to(torch::kFloat32)) * sin)
                 .to(dtype);
    auto k = (q_k_v[1].to(torch::kFloat32) * cos + rotate_half(q_k_v[1].to(torch::kFloat32)) * sin)
                 .to(dtype);
    auto v = q_k_v[2];
    std::vector<torch::Tensor> parts;
    for (size_t b = 0; b + 1 < bounds.size(); ++b) {
      const int64_t start = bounds[b], len = bounds[b + 1] - bounds[b];
      if (len == 0) continue;
      auto head_major = [&](const torch::Tensor& z) {
        return z.narrow(0, start, len).transpose(0, 1).unsqueeze(0);  // [1, H, len, D]
      };
      parts.push_back(
          nn::attention(head_major(q), head_major(k), head_major(v)).squeeze(0).transpose(0, 1));
    }
    auto attn = torch::cat(parts, 0).reshape({N, H * D});
    h = h + proj[i](attn);
    h = h + mlp[i](norm2[i](h));
  }
  auto merged = merger_fc2(torch::gelu(merger_fc1(ln_q(h).view({N / unit, -1}))));
  // Back from window order to the image's row-major order of merged tokens.
  return merged.index_select(0, torch::argsort(index).to(merged.device()));
}

Qwen2_5_VLForConditionalGenerationImpl::Qwen2_5_VLForConditionalGenerationImpl(
    const Qwen2_5_VLConfig& config)
    : config_(config) {
  model = register_module("model", LlamaModel(config.text));
  if (config.has_vision)
    visual = register_module("visual", Qwen2_5_VisionTransformer(config.vision));
}

std::pair<torch::Tensor, torch::Tensor> qwen2_5_vl_rope_index(const torch::Tensor& input_ids,
                                                              const torch::Tensor& attention_mask,
                                                              const Qwen2_5_VLConfig& config,
                                                              const std::array<int64_t, 3>& grid) {
  const auto ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t B = ids.size(0), L = ids.size(1);
  const auto mask = attention_mask.defined()
                        ? attention_mask.to(torch::kCPU, torch::kInt64).contiguous()
                        : torch::ones({B, L}, torch::kInt64);
  auto positions = torch::ones({3, B, L}, torch::kInt64);
  auto deltas = torch::zeros({B, 1}, torch::kInt64);
  const int64_t M = config.vision.spatial_merge_size;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> kept;  // indices of the attended tokens
    for (int64_t j = 0; j < L; ++j)
      if (mask[b][j].item<int64_t>() == 1) kept.push_back(j);
    const auto* row = ids[b].data_ptr<int64_t>();
    std::vector<std::array<int64_t, 3>> pos;
    pos.reserve(kept.size());
    int64_t next = 0;  // the position after the last one given
    size_t i = 0;
    while (i < kept.size()) {
      const bool image = row[kept[i]] == config.image_token_id && i > 0 &&
                         row[kept[i - 1]] == config.vision_start_token_id;
      if (!image) {
        pos.push_back({next, next, next});
        ++next, ++i;
        continue;
      }
      const int64_t lt = grid[0], lh = grid[1] / M, lw = grid[2] / M;
      int64_t top = next;
      for (int64_t f = 0; f < lt && i < kept.size(); ++f)
        for (int64_t y = 0; y < lh && i < kept.size(); ++y)
          for (int64_t x = 0; x < lw && i < kept.size(); ++x, ++i) {
            pos.push_back({next, next + y, next + x});  // images: t index 0
            top = std::max({top, next + y, next + x});
          }
      next = top + 1;
    }
    int64_t max_pos = -1;
    for (size_t k = 0; k < kept.size(); ++k)
      for (int a = 0; a < 3; ++a) {
        positions[a][b][kept[k]] = pos[k][static_cast<size_t>(a)];
        max_pos = std::max(max_pos, pos[k][static_cast<size_t>(a)]);
      }
    deltas[b][0] = max_pos + 1 - L;
  }
  return {positions, deltas};
}

Qwen2_5_VLOutput Qwen2_5_VLForConditionalGenerationImpl::forward(
    const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
    const torch::Tensor& pixel_values, const std::array<int64_t, 3>& grid) {
  const auto& c = config_;
  if (input_ids.dim() != 2)
    throw InvalidArgument("Qwen2.5-VL: input_ids must be [batch, tokens], got " +
                          c10::str(input_ids.sizes()));
  const auto device = model->embed_tokens->weight.device();
  const auto dtype = model->embed_tokens->weight.scalar_type();
  auto ids = input_ids.to(device, torch::kInt64);
  if (ids.numel() &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.text.vocab_size))
    throw InvalidArgument("Qwen2.5-VL: token id outside [0, " + std::to_string(c.text.vocab_size) +
                          ")");
  const int64_t B = ids.size(0);
  auto h = model->embed_tokens(ids);
  Qwen2_5_VLOutput out;
  const auto image_mask = ids == c.image_token_id;
  const int64_t image_tokens = image_mask.sum().item<int64_t>();
  if (pixel_values.defined()) {
    if (!visual)
      throw InvalidArgument(
          "Qwen2.5-VL: this text encoder has no vision tower (no vision_config in " + c.source +
          "), so it cannot read an image; an edit needs Qwen2.5-VL's full weights");
    out.image_embeds = visual->forward(pixel_values, grid);
    const int64_t per_image = out.image_embeds.size(0);
    if (image_tokens != per_image * B)
      throw InvalidArgument("Qwen2.5-VL: the prompt has " + std::to_string(image_tokens) +
                            " <|image_pad|> tokens, the image makes " + std::to_string(per_image) +
                            " per sequence");
    // masked_scatter: the image tokens take the embeddings in order.
    h = h.masked_scatter(image_mask.unsqueeze(-1).expand_as(h),
                         out.image_embeds.to(dtype).repeat({B, 1}));
  } else if (image_tokens > 0) {
    throw InvalidArgument("Qwen2.5-VL: the prompt has " + std::to_string(image_tokens) +
                          " <|image_pad|> tokens but no image was given");
  }
  std::tie(out.position_ids, out.rope_deltas) = qwen2_5_vl_rope_index(ids, attention_mask, c, grid);

  torch::Tensor bias;
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != ids.sizes())
      throw InvalidArgument("Qwen2.5-VL: attention_mask " + c10::str(attention_mask.sizes()) +
                            " does not match input_ids " + c10::str(ids.sizes()));
    if (!attention_mask.to(torch::kBool).all().item<bool>())
      bias = nn::key_padding_bias(attention_mask.to(device), dtype);
  }
  // mRoPE: the angles of each axis's positions, then each frequency band takes its axis
  // (mrope_section, repeated for both halves of the rotated dimensions).
  const auto inv_freq = llama_inv_freq(c.text).to(device);         // [D / 2]
  auto pos = out.position_ids.to(device, torch::kFloat32);         // [3, B, L]
  auto angles = pos.unsqueeze(-1) * inv_freq.view({1, 1, 1, -1});  // [3, B, L, D / 2]
  auto emb = torch::cat({angles, angles}, -1);                     // [3, B, L, D]
  auto cos_all = emb.cos(), sin_all = emb.sin();
  std::vector<torch::Tensor> cos_parts, sin_parts;
  int64_t offset = 0;
  for (int half = 0; half < 2; ++half)
    for (int a = 0; a < 3; ++a) {
      const int64_t n = c.mrope_section[static_cast<size_t>(a)];
      cos_parts.push_back(cos_all[a].narrow(-1, offset, n));
      sin_parts.push_back(sin_all[a].narrow(-1, offset, n));
      offset += n;
    }
  const auto cos = torch::cat(cos_parts, -1).unsqueeze(1).to(dtype);  // [B, 1, L, D]
  const auto sin = torch::cat(sin_parts, -1).unsqueeze(1).to(dtype);

  for (const auto& layer : *model->layers)
    h = layer->as<LlamaDecoderLayer>()->forward(h, cos, sin, bias);
  out.last_hidden_state = model->norm(h);
  return out;
}

bool qwen2_5_vl_has_vision(const io::ModelFolder& folder, const std::string& component) {
  if (!folder.component_config(component).has("vision_config")) return false;
  for (const auto& item : folder.component_weights(component))
    if (io::starts_with(item.first, "visual.") || io::starts_with(item.first, "model.visual."))
      return true;
  return false;
}

Qwen2_5_VLForConditionalGeneration load_qwen2_5_vl(const io::ModelFolder& folder,
                                                   const std::string& component,
                                                   torch::Device device, torch::Dtype dtype) {
  auto config = Qwen2_5_VLConfig::from_json(folder.component_config(component));
  auto weights = folder.component_weights(component);
  // transformers >= 4.53 saves model.language_model.* and model.visual.*; ComfyUI's single
  // files keep the v4.51 names this module uses.
  std::map<std::string, torch::Tensor> named;
  bool vision_weights = false;
  for (auto& [key, value] : weights) {
    std::string name = key;
    if (io::starts_with(name, "model.language_model."))
      name = "model." + name.substr(std::string("model.language_model.").size());
    else if (io::starts_with(name, "model.visual."))
      name = name.substr(std::string("model.").size());
    if (io::starts_with(name, "visual.")) vision_weights = true;
    if (name == "lm_head.weight") continue;  // never used by the pipelines
    named.emplace(std::move(name), value);
  }
  // A text-only checkpoint: text-to-image still works; edits say what is missing.
  if (config.has_vision && !vision_weights) config.has_vision = false;
  Qwen2_5_VLForConditionalGeneration model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = Qwen2_5_VLForConditionalGeneration(config);
  }
  const auto report = nn::load_state_dict(*model, named, folder.component_dir(component));
  if (!report.unexpected.empty())
    throw FormatError(folder.component_dir(component) +
                      ": the weights have tensors the model built from config.json does not "
                      "have, e.g. '" +
                      *report.unexpected.begin() + "' (does config.json match the weights?)");
  model->to(device, dtype);
  model->eval();
  return model;
}

}  // namespace diffuse::models
