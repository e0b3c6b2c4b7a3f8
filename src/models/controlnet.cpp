#include "models/controlnet.h"

#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "io/ldm_key_map.h"
#include "io/model_folder.h"
#include "models/config_values.h"
#include "nn/fused_ops.h"
#include "nn/load_weights.h"

namespace diffuse::models {
namespace fs = std::filesystem;

ControlNetConfig ControlNetConfig::from_json(const io::JsonConfig& cfg) {
  ControlNetConfig c;
  const auto cls = cfg.get<std::string>("_class_name", "ControlNetModel");
  if (cls != "ControlNetModel")
    cfg.fail("_class_name", "expected ControlNetModel, got \"" + cls + "\"");
  nlohmann::json j = cfg.json();
  j["_class_name"] = "ControlNetModel";  // the encoder half of the UNet config
  c.unet = UNet2DConditionConfig::from_json(io::JsonConfig(j, cfg.source()));
  if (cfg.has("conditioning_embedding_out_channels"))
    c.conditioning_embedding_out_channels =
        read_int_list(cfg, "conditioning_embedding_out_channels");
  if (c.conditioning_embedding_out_channels.empty() ||
      c.conditioning_embedding_out_channels.size() > 8)
    cfg.fail("conditioning_embedding_out_channels", "expected 1 to 8 levels");
  c.conditioning_channels = read_int_in(cfg, "conditioning_channels", 3, 1, 64);
  const auto order = cfg.get<std::string>("controlnet_conditioning_channel_order", "rgb");
  if (order != "rgb" && order != "bgr")
    cfg.fail("controlnet_conditioning_channel_order",
             "expected \"rgb\" or \"bgr\", got \"" + order + "\"");
  c.bgr = order == "bgr";
  c.global_pool_conditions = cfg.get<bool>("global_pool_conditions", false);
  return c;
}

int64_t ControlNetConfig::condition_factor() const {
  return int64_t{1} << (conditioning_embedding_out_channels.size() - 1);
}

ControlNetConditioningEmbeddingImpl::ControlNetConditioningEmbeddingImpl(
    int64_t embedding_channels, int64_t conditioning_channels, const std::vector<int64_t>& boc) {
  const auto conv = [](int64_t in, int64_t out, int64_t stride) {
    return nn::make_conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).stride(stride));
  };
  conv_in = register_module("conv_in", conv(conditioning_channels, boc[0], 1));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (size_t i = 0; i + 1 < boc.size(); ++i) {
    block_list.push_back(conv(boc[i], boc[i], 1));
    block_list.push_back(conv(boc[i], boc[i + 1], 2));
  }
  for (auto& b : block_list) blocks->push_back(b);
  conv_out = register_module("conv_out", conv(boc.back(), embedding_channels, 1));
}

torch::Tensor ControlNetConditioningEmbeddingImpl::forward(const torch::Tensor& conditioning) {
  auto x = torch::silu(conv_in(conditioning));
  for (auto& b : block_list) x = torch::silu(b(x));
  return conv_out(x);
}

ControlNetModelImpl::ControlNetModelImpl(ControlNetConfig config)
    : UNet2DConditionModelImpl(config.unet), cn_config_(std::move(config)) {
  const auto& c = cn_config_;
  const auto& boc = c.unet.block_out_channels;
  controlnet_cond_embedding =
      register_module("controlnet_cond_embedding",
                      ControlNetConditioningEmbedding(boc[0], c.conditioning_channels,
                                                      c.conditioning_embedding_out_channels));
  const auto zero_conv = [](int64_t ch) {
    return nn::make_conv2d(torch::nn::Conv2dOptions(ch, ch, 1));
  };
  controlnet_down_blocks = register_module("controlnet_down_blocks", torch::nn::ModuleList());
  // One per skip connection the down path pushes: conv_in's output, then per block its
  // resnets (with their attentions) and its downsampler.
  controlnet_down_list.push_back(zero_conv(boc[0]));
  for (size_t i = 0; i < down_list.size(); ++i) {
    for (int64_t k = 0; k < c.unet.layers_per_block[i]; ++k)
      controlnet_down_list.push_back(zero_conv(boc[i]));
    if (i + 1 < down_list.size()) controlnet_down_list.push_back(zero_conv(boc[i]));
  }
  for (auto& m : controlnet_down_list) controlnet_down_blocks->push_back(m);
  controlnet_mid_block = register_module("controlnet_mid_block", zero_conv(boc.back()));
}

UNetControlResiduals ControlNetModelImpl::forward(const torch::Tensor& sample,
                                                  const torch::Tensor& timestep,
                                                  const torch::Tensor& encoder_hidden_states,
                                                  const torch::Tensor& controlnet_cond,
                                                  double conditioning_scale, bool guess_mode,
                                                  Intermediates* intermediates,
                                                  const UNetAddedConditions* added) {
  const auto& c = cn_config_;
  const std::string who = "ControlNetModel (" + c.unet.source + "): ";
  if (!controlnet_cond.defined() || controlnet_cond.dim() != 4 ||
      controlnet_cond.size(1) != c.conditioning_channels)
    throw InvalidArgument(
        who + "controlnet_cond must be [batch, " + std::to_string(c.conditioning_channels) +
        ", H, W], got " +
        (controlnet_cond.defined() ? c10::str(controlnet_cond.sizes()) : std::string("no tensor")));
  if (sample.defined() && sample.dim() == 4) {
    const int64_t f = c.condition_factor();
    if (controlnet_cond.size(0) != sample.size(0) ||
        controlnet_cond.size(2) != sample.size(2) * f ||
        controlnet_cond.size(3) != sample.size(3) * f)
      throw InvalidArgument(who + "controlnet_cond " + c10::str(controlnet_cond.sizes()) +
                            " does not fit the sample " + c10::str(sample.sizes()) +
                            ": expected the same batch and " + std::to_string(f) +
                            "x its height and width");
  }
  if (!std::isfinite(conditioning_scale))
    throw InvalidArgument(who + "conditioning_scale must be finite");
  const auto hint = [&](const torch::Tensor& like) {
    auto cond = controlnet_cond.to(like.device(), like.scalar_type());
    if (c.bgr) cond = cond.flip(1);
    auto e = controlnet_cond_embedding(cond);
    capture(intermediates, "controlnet_cond_embedding", e);
    return e;
  };
  auto enc = forward_encoder(sample, timestep, encoder_hidden_states, hint, intermediates, added);
  if (enc.skips.size() != controlnet_down_list.size())
    throw InvalidArgument(who + "the down path gave " + std::to_string(enc.skips.size()) +
                          " skip connections, expected " +
                          std::to_string(controlnet_down_list.size()));
  UNetControlResiduals out;
  for (size_t i = 0; i < enc.skips.size(); ++i)
    out.down.push_back(controlnet_down_list[i](enc.skips[i]));
  out.mid = controlnet_mid_block(enc.mid);
  // As diffusers: the scales are float32 tensors (logspace in float32 for guess mode).
  const auto opts = torch::TensorOptions(torch::kFloat32).device(out.mid.device());
  if (guess_mode && !c.global_pool_conditions) {
    const auto scales = guess_mode_scales(static_cast<int64_t>(out.down.size()), conditioning_scale,
                                          out.mid.device());
    for (size_t i = 0; i < out.down.size(); ++i)
      out.down[i] = out.down[i] * scales[static_cast<int64_t>(i)].to(out.down[i].scalar_type());
    out.mid = out.mid * scales[-1].to(out.mid.scalar_type());
  } else {
    const auto s = torch::scalar_tensor(conditioning_scale, opts);
    for (auto& d : out.down) d = d * s.to(d.scalar_type());
    out.mid = out.mid * s.to(out.mid.scalar_type());
  }
  if (c.global_pool_conditions) {
    for (auto& d : out.down) d = d.mean({2, 3}, /*keepdim=*/true);
    out.mid = out.mid.mean({2, 3}, /*keepdim=*/true);
  }
  return out;
}

torch::Tensor guess_mode_scales(int64_t n, double conditioning_scale, torch::Device device) {
  const auto opts = torch::TensorOptions(torch::kFloat32).device(device);
  return torch::logspace(-1, 0, n + 1, 10.0, opts) * conditioning_scale;
}

namespace {

// The weights file of a ControlNet folder: diffusion_pytorch_model.safetensors (or its shard
// index), or the folder's only *.safetensors file.
std::string controlnet_weights_file(const fs::path& dir) {
  for (const char* name :
       {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"})
    if (fs::exists(dir / name)) return (dir / name).string();
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  if (found.size() == 1) return found.front();
  throw IoError(dir.string() +
                ": no ControlNet weights (expected "
                "diffusion_pytorch_model.safetensors" +
                (found.empty() ? std::string() : ", or a single *.safetensors file") + ")");
}

}  // namespace

namespace {

// An original ControlNet checkpoint: control_model.* keys (or the same without the prefix).
ControlNetModel load_controlnet_file(const std::string& path, torch::Device device,
                                     torch::Dtype dtype, const UNet2DConditionConfig* unet) {
  if (!unet)
    throw InvalidArgument(path +
                          ": a single-file ControlNet takes its configuration from the "
                          "UNet it steers; load it with a model");
  io::ldm::TensorMap pool;
  for (auto& [name, t] : io::load_weights_file(path)) {
    const std::string prefix = "control_model.";
    pool[name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name] = t;
  }
  const auto layout = io::ldm::parse_controlnet_layout(pool, path);
  ControlNetConfig c;
  c.unet = *unet;
  c.unet.source = path;
  c.unet.encoder_only = true;
  c.unet.up_block_types.clear();
  c.unet.in_channels = layout.unet.in_channels;
  c.conditioning_channels = layout.conditioning_channels;
  c.conditioning_embedding_out_channels = layout.hint_channels;
  // The weights' own structure must be the UNet's (the heads come from the UNet's config).
  const auto& down = layout.unet.down;
  bool fits = down.size() == unet->block_out_channels.size() &&
              layout.unet.cross_attention_dim == unet->cross_attention_dim.front();
  for (size_t i = 0; fits && i < down.size(); ++i)
    fits = down[i].channels == unet->block_out_channels[i] &&
           static_cast<int64_t>(down[i].blocks.size()) == unet->layers_per_block[i] &&
           down[i].attention == (unet->down_block_types[i] == "CrossAttnDownBlock2D");
  if (!fits)
    throw InvalidArgument(
        path + ": this ControlNet's blocks (" + std::to_string(down.size()) +
        " levels, cross-attention width " + std::to_string(layout.unet.cross_attention_dim) +
        ") do not fit the UNet (" + unet->source + "): it was made for another base model");
  c.unet.use_linear_projection = layout.unet.use_linear_projection;
  auto weights = io::ldm::map_controlnet(pool, layout, path);
  if (!pool.empty())
    throw FormatError(path + ": " + std::to_string(pool.size()) +
                      " tensors are not part of a ControlNet (first: '" + pool.begin()->first +
                      "')");
  ControlNetModel model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);
    model = ControlNetModel(c);
  }
  const auto report = nn::load_state_dict(*model, weights, path);
  if (!report.unexpected.empty())
    throw FormatError(path + ": tensor '" + *report.unexpected.begin() +
                      "' has no place in the ControlNet");
  model->to(device, dtype);
  nn::use_compute_layout(*model);
  model->eval();
  return model;
}

}  // namespace

namespace {

// The folder holding a ControlNet's config.json (a pipeline folder's controlnet/), or nullopt
// for a checkpoint file; IoError / InvalidArgument for anything else.
std::optional<fs::path> controlnet_folder(const std::string& path) {
  fs::path dir(path);
  if (!fs::exists(dir)) throw IoError(path + ": no such ControlNet folder or file");
  if (!fs::is_directory(dir)) {
    if (dir.extension() != ".safetensors")
      throw InvalidArgument(path +
                            ": ControlNets are read from diffusers folders or "
                            "*.safetensors checkpoints");
    return std::nullopt;
  }
  if (!fs::exists(dir / "config.json") && fs::exists(dir / "model_index.json") &&
      fs::exists(dir / "controlnet" / "config.json"))
    dir /= "controlnet";
  if (!fs::exists(dir / "config.json"))
    throw IoError(path + ": no config.json (a ControlNet folder has config.json and its weights)");
  return dir;
}

}  // namespace

std::optional<ControlNetConfig> read_controlnet_config(const std::string& path) {
  const auto dir = controlnet_folder(path);
  if (!dir) return std::nullopt;
  return ControlNetConfig::from_json(io::JsonConfig::load((*dir / "config.json").string()));
}

std::string controlnet_weights_path(const std::string& path) {
  const auto dir = controlnet_folder(path);
  return dir ? controlnet_weights_file(*dir) : path;
}

ControlNetModel load_controlnet(const std::string& path, torch::Device device, torch::Dtype dtype,
                                const UNet2DConditionConfig* unet) {
  const auto dir = controlnet_folder(path);
  if (!dir) return load_controlnet_file(path, device, dtype, unet);
  ControlNetModel model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = ControlNetModel(*read_controlnet_config(path));
  }
  const auto file = controlnet_weights_file(*dir);
  const auto report = nn::load_state_dict(*model, io::load_weights_file(file), file);
  if (!report.unexpected.empty())
    throw FormatError(file + ": has " + std::to_string(report.unexpected.size()) +
                      " tensors the ControlNet does not know (first: '" +
                      *report.unexpected.begin() + "'): the config does not match its weights");
  model->to(device, dtype);
  nn::use_compute_layout(*model);
  model->eval();
  return model;
}

}  // namespace diffuse::models
