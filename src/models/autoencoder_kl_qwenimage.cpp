#include "models/autoencoder_kl_qwenimage.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/config_values.h"
#include "models/load_component.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace diffuse::models {

// A stage of the encoder or decoder: one module of diffusers' tree, run on [B, C, H, W].
struct AutoencoderKLQwenImageImpl::Layer : torch::nn::Module {
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

namespace {

using Layer = AutoencoderKLQwenImageImpl::Layer;

// QwenImageCausalConv3d on one frame: the time padding is 2 * pad before the frame and none
// after, so only the time tap at index 2 * pad meets the frame.
struct CausalConv : Layer {
  CausalConv(int64_t in, int64_t out, std::array<int64_t, 3> kernel, int64_t pad_t, int64_t pad_s)
      : tap(2 * pad_t), pad(pad_s) {
    weight = register_parameter("weight", torch::empty({out, in, kernel[0], kernel[1], kernel[2]}),
                                false);
    bias = register_parameter("bias", torch::empty({out}), false);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::conv2d(x, weight.select(2, tap), bias, 1, pad);
  }
  int64_t tap, pad;
  torch::Tensor weight, bias;
};

// QwenImageRMS_norm: F.normalize over channels (L2, eps 1e-12) * sqrt(C) * gamma.
struct RmsNorm : Layer {
  RmsNorm(int64_t dim, bool images) : scale(std::sqrt(static_cast<double>(dim))) {
    gamma = register_parameter(
        "gamma", images ? torch::ones({dim, 1, 1}) : torch::ones({dim, 1, 1, 1}), false);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    // Half precision normalises in float32 (the reference does too).
    auto xf = x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kFloat64
                  ? x
                  : x.to(torch::kFloat32);
    auto n = torch::nn::functional::normalize(
                 xf, torch::nn::functional::NormalizeFuncOptions().dim(1).eps(1e-12))
                 .to(x.scalar_type());
    return n * scale * gamma.view({1, -1, 1, 1});
  }
  double scale;
  torch::Tensor gamma;
};

struct ResidualBlock : Layer {
  ResidualBlock(int64_t in, int64_t out) {
    norm1 = register_module("norm1", std::make_shared<RmsNorm>(in, false));
    conv1 = register_module(
        "conv1", std::make_shared<CausalConv>(in, out, std::array<int64_t, 3>{3, 3, 3}, 1, 1));
    norm2 = register_module("norm2", std::make_shared<RmsNorm>(out, false));
    conv2 = register_module(
        "conv2", std::make_shared<CausalConv>(out, out, std::array<int64_t, 3>{3, 3, 3}, 1, 1));
    if (in != out)
      shortcut = register_module(
          "conv_shortcut",
          std::make_shared<CausalConv>(in, out, std::array<int64_t, 3>{1, 1, 1}, 0, 0));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto h = shortcut ? shortcut->forward(x) : x;  // the shortcut takes x before the norm
    auto y = conv1->forward(torch::silu(norm1->forward(x)));
    y = conv2->forward(torch::silu(norm2->forward(y)));
    return y + h;
  }
  std::shared_ptr<RmsNorm> norm1, norm2;
  std::shared_ptr<CausalConv> conv1, conv2, shortcut;
};

// A 2D convolution with weight [out, in, k, k] and bias ("to_qkv", "resample.1").
struct Conv2dParams : torch::nn::Module {
  Conv2dParams(int64_t in, int64_t out, int64_t k) {
    weight = register_parameter("weight", torch::empty({out, in, k, k}), false);
    bias = register_parameter("bias", torch::empty({out}), false);
  }
  torch::Tensor weight, bias;
};

// QwenImageAttentionBlock: single-head attention over the pixels of each frame.
struct AttentionBlock : Layer {
  explicit AttentionBlock(int64_t dim) {
    norm = register_module("norm", std::make_shared<RmsNorm>(dim, true));
    to_qkv = register_module("to_qkv", std::make_shared<Conv2dParams>(dim, 3 * dim, 1));
    proj = register_module("proj", std::make_shared<Conv2dParams>(dim, dim, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    auto qkv = torch::conv2d(norm->forward(x), to_qkv->weight, to_qkv->bias);
    auto chunks = qkv.reshape({B, 1, 3 * C, H * W}).permute({0, 1, 3, 2}).chunk(3, -1);
    auto out = nn::attention(chunks[0], chunks[1], chunks[2]);  // [B, 1, HW, C]
    out = out.squeeze(1).permute({0, 2, 1}).reshape({B, C, H, W});
    return torch::conv2d(out, proj->weight, proj->bias) + x;
  }
  std::shared_ptr<RmsNorm> norm;
  std::shared_ptr<Conv2dParams> to_qkv, proj;
};

// QwenImageResample: 2x down (zero pad right/bottom, 3x3 stride 2) or up (nearest 2x, 3x3 to
// half the channels); its time_conv is loaded but never runs on a first frame.
struct Resample : Layer {
  Resample(int64_t dim, const std::string& mode) : up(mode.rfind("upsample", 0) == 0) {
    auto seq = register_module("resample", std::make_shared<torch::nn::Module>());
    conv = seq->register_module("1", std::make_shared<Conv2dParams>(dim, up ? dim / 2 : dim, 3));
    if (mode == "upsample3d")
      register_module("time_conv", std::make_shared<CausalConv>(
                                       dim, dim * 2, std::array<int64_t, 3>{3, 1, 1}, 1, 0));
    else if (mode == "downsample3d")
      register_module("time_conv", std::make_shared<CausalConv>(
                                       dim, dim, std::array<int64_t, 3>{3, 1, 1}, 0, 0));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    if (up) {
      // nearest-exact at scale 2 repeats every pixel (the reference upsamples in float32).
      auto y = torch::nn::functional::interpolate(x.to(torch::kFloat32),
                                                  torch::nn::functional::InterpolateFuncOptions()
                                                      .scale_factor(std::vector<double>{2.0, 2.0})
                                                      .mode(torch::kNearest))
                   .to(x.scalar_type());
      return torch::conv2d(y, conv->weight, conv->bias, 1, 1);
    }
    return torch::conv2d(torch::constant_pad_nd(x, {0, 1, 0, 1}), conv->weight, conv->bias, 2);
  }
  bool up;
  std::shared_ptr<Conv2dParams> conv;
};

struct NormSilu : Layer {
  explicit NormSilu(std::shared_ptr<RmsNorm> n) : norm(std::move(n)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return torch::silu(norm->forward(x)); }
  std::shared_ptr<RmsNorm> norm;
};

// QwenImageMidBlock(num_layers=1): resnet, attention, resnet.
void add_mid_block(torch::nn::Module& parent, int64_t dim,
                   std::vector<std::shared_ptr<Layer>>& run) {
  auto mid = parent.register_module("mid_block", std::make_shared<torch::nn::Module>());
  auto resnets = mid->register_module("resnets", torch::nn::ModuleList());
  auto attentions = mid->register_module("attentions", torch::nn::ModuleList());
  auto r0 = std::make_shared<ResidualBlock>(dim, dim);
  auto a0 = std::make_shared<AttentionBlock>(dim);
  auto r1 = std::make_shared<ResidualBlock>(dim, dim);
  resnets->push_back(r0);
  resnets->push_back(r1);
  attentions->push_back(a0);
  run.insert(run.end(), {r0, a0, r1});
}

template <typename T>
std::shared_ptr<T> add(torch::nn::Module& parent, const std::string& name, std::shared_ptr<T> m,
                       std::vector<std::shared_ptr<Layer>>& run) {
  parent.register_module(name, m);
  run.push_back(m);
  return m;
}

std::vector<float> read_floats(const io::JsonConfig& cfg, const std::string& key, size_t n) {
  const auto v = cfg.get<std::vector<double>>(key, {});
  if (v.size() != n)
    cfg.fail(key, "expected " + std::to_string(n) + " numbers (one per z channel)");
  std::vector<float> out;
  for (double d : v) {
    if (!std::isfinite(d)) cfg.fail(key, "values must be finite");
    out.push_back(static_cast<float>(d));
  }
  return out;
}

}  // namespace

AutoencoderKLQwenImageConfig AutoencoderKLQwenImageConfig::from_json(const io::JsonConfig& cfg) {
  AutoencoderKLQwenImageConfig c;
  c.source = cfg.source();
  c.base_dim = read_int_in(cfg, "base_dim", c.base_dim, 1, kMaxConfigDim);
  c.z_dim = read_int_in(cfg, "z_dim", c.z_dim, 1, 1024);
  if (cfg.has("dim_mult")) c.dim_mult = read_int_list(cfg, "dim_mult", 64);
  if (c.dim_mult.empty() || c.dim_mult.size() > 8)
    cfg.fail("dim_mult", "expected 1 to 8 multipliers");
  for (auto m : c.dim_mult)
    if (m < 1 || c.base_dim * m > kMaxConfigDim) cfg.fail("dim_mult", "multipliers must be >= 1");
  c.num_res_blocks = read_int_in(cfg, "num_res_blocks", c.num_res_blocks, 1, 64);
  c.attn_scales = cfg.get<std::vector<double>>("attn_scales", {});
  c.temperal_downsample = cfg.get<std::vector<bool>>("temperal_downsample", c.temperal_downsample);
  if (c.temperal_downsample.size() + 1 < c.dim_mult.size())
    cfg.fail("temperal_downsample", "needs one entry per down-sampling stage (" +
                                        std::to_string(c.dim_mult.size() - 1) + ")");
  c.input_channels = read_int_in(cfg, "input_channels", 3, 1, 16);
  if (c.input_channels != 3) cfg.fail("input_channels", "only RGB images (3) are supported");
  if (cfg.get<double>("dropout", 0.0) != 0.0) cfg.fail("dropout", "inference needs 0");
  c.latents_mean = cfg.has("latents_mean") ? read_floats(cfg, "latents_mean", c.z_dim)
                                           : std::vector<float>(c.z_dim, 0.0f);
  c.latents_std = cfg.has("latents_std") ? read_floats(cfg, "latents_std", c.z_dim)
                                         : std::vector<float>(c.z_dim, 1.0f);
  for (float s : c.latents_std)
    if (!(s > 0)) cfg.fail("latents_std", "every value must be positive");
  return c;
}

torch::Tensor AutoencoderKLQwenImageConfig::to_latents(const torch::Tensor& z) const {
  auto mean = torch::tensor(latents_mean).view({1, -1, 1, 1}).to(z.device(), z.scalar_type());
  auto std = torch::tensor(latents_std).view({1, -1, 1, 1}).to(z.device(), z.scalar_type());
  return (z - mean) / std;
}

torch::Tensor AutoencoderKLQwenImageConfig::from_latents(const torch::Tensor& latents) const {
  auto mean =
      torch::tensor(latents_mean).view({1, -1, 1, 1}).to(latents.device(), latents.scalar_type());
  auto std =
      torch::tensor(latents_std).view({1, -1, 1, 1}).to(latents.device(), latents.scalar_type());
  return latents * std + mean;
}

AutoencoderKLQwenImageImpl::AutoencoderKLQwenImageImpl(AutoencoderKLQwenImageConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t stages = static_cast<int64_t>(c.dim_mult.size());
  const std::array<int64_t, 3> k3{3, 3, 3}, k1{1, 1, 1};

  // Encoder: dims = base * [1] + dim_mult.
  auto enc = register_module("encoder", std::make_shared<torch::nn::Module>());
  std::vector<int64_t> dims{c.base_dim};
  for (auto m : c.dim_mult) dims.push_back(c.base_dim * m);
  add(*enc, "conv_in", std::make_shared<CausalConv>(c.input_channels, dims[0], k3, 1, 1), encoder_);
  auto down = enc->register_module("down_blocks", torch::nn::ModuleList());
  double scale = 1.0;
  for (int64_t i = 0; i < stages; ++i) {
    int64_t in = dims[i];
    const int64_t out = dims[i + 1];
    for (int64_t r = 0; r < c.num_res_blocks; ++r) {
      auto block = std::make_shared<ResidualBlock>(in, out);
      down->push_back(block), encoder_.push_back(block);
      if (std::find(c.attn_scales.begin(), c.attn_scales.end(), scale) != c.attn_scales.end()) {
        auto attn = std::make_shared<AttentionBlock>(out);
        down->push_back(attn), encoder_.push_back(attn);
      }
      in = out;
    }
    if (i != stages - 1) {
      auto rs = std::make_shared<Resample>(
          out, c.temperal_downsample[static_cast<size_t>(i)] ? "downsample3d" : "downsample2d");
      down->push_back(rs), encoder_.push_back(rs);
      scale /= 2.0;
    }
  }
  const int64_t top = dims.back();
  add_mid_block(*enc, top, encoder_);
  auto enc_norm = std::make_shared<RmsNorm>(top, false);
  enc->register_module("norm_out", enc_norm);
  encoder_.push_back(std::make_shared<NormSilu>(enc_norm));
  add(*enc, "conv_out", std::make_shared<CausalConv>(top, 2 * c.z_dim, k3, 1, 1), encoder_);
  quant_conv_ = std::make_shared<CausalConv>(2 * c.z_dim, 2 * c.z_dim, k1, 0, 0);
  register_module("quant_conv", quant_conv_);
  post_quant_conv_ = std::make_shared<CausalConv>(c.z_dim, c.z_dim, k1, 0, 0);
  register_module("post_quant_conv", post_quant_conv_);

  // Decoder: dims = base * ([dim_mult[-1]] + reversed dim_mult); the time up-sampling flags are
  // the down-sampling ones reversed.
  auto dec = register_module("decoder", std::make_shared<torch::nn::Module>());
  std::vector<int64_t> ddims{c.base_dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it)
    ddims.push_back(c.base_dim * *it);
  std::vector<bool> temporal_up(c.temperal_downsample.begin(),
                                c.temperal_downsample.begin() + (stages - 1));
  std::reverse(temporal_up.begin(), temporal_up.end());
  add(*dec, "conv_in", std::make_shared<CausalConv>(c.z_dim, ddims[0], k3, 1, 1), decoder_);
  add_mid_block(*dec, ddims[0], decoder_);
  auto ups = dec->register_module("up_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < stages; ++i) {
    int64_t in = i > 0 ? ddims[i] / 2 : ddims[i];
    const int64_t out = ddims[i + 1];
    auto block = std::make_shared<torch::nn::Module>();
    auto resnets = block->register_module("resnets", torch::nn::ModuleList());
    for (int64_t r = 0; r < c.num_res_blocks + 1; ++r) {
      auto rb = std::make_shared<ResidualBlock>(in, out);
      resnets->push_back(rb), decoder_.push_back(rb);
      in = out;
    }
    if (i != stages - 1) {
      auto list = block->register_module("upsamplers", torch::nn::ModuleList());
      auto rs = std::make_shared<Resample>(
          out, temporal_up[static_cast<size_t>(i)] ? "upsample3d" : "upsample2d");
      list->push_back(rs), decoder_.push_back(rs);
    }
    ups->push_back(block);
  }
  auto dec_norm = std::make_shared<RmsNorm>(ddims.back(), false);
  dec->register_module("norm_out", dec_norm);
  decoder_.push_back(std::make_shared<NormSilu>(dec_norm));
  add(*dec, "conv_out", std::make_shared<CausalConv>(ddims.back(), c.input_channels, k3, 1, 1),
      decoder_);
}

LatentDist AutoencoderKLQwenImageImpl::encode(const torch::Tensor& x) {
  const int64_t f = config_.spatial_factor();
  if (x.dim() != 4 || x.size(1) != config_.input_channels || x.size(2) % f != 0 ||
      x.size(3) % f != 0 || x.size(2) == 0 || x.size(3) == 0)
    throw InvalidArgument(
        "AutoencoderKLQwenImage.encode: expected [B, 3, H, W] with H and W "
        "positive multiples of " +
        std::to_string(f) + ", got " + c10::str(x.sizes()));
  const auto w = quant_conv_->parameters().front();
  auto h = x.to(w.device(), w.scalar_type());
  for (auto& layer : encoder_) h = layer->forward(h);
  return LatentDist::from_moments(quant_conv_->forward(h));
}

torch::Tensor AutoencoderKLQwenImageImpl::decode(const torch::Tensor& z) {
  if (z.dim() != 4 || z.size(1) != config_.z_dim || z.size(2) == 0 || z.size(3) == 0)
    throw InvalidArgument("AutoencoderKLQwenImage.decode: expected z [B, " +
                          std::to_string(config_.z_dim) + ", h, w], got " + c10::str(z.sizes()));
  const auto w = post_quant_conv_->parameters().front();
  auto h = post_quant_conv_->forward(z.to(w.device(), w.scalar_type()));
  for (auto& layer : decoder_) h = layer->forward(h);
  return h;
}

bool is_qwenimage_vae(const io::ModelFolder& folder, const std::string& component) {
  return folder.has_component(component) &&
         folder.component_config(component, "config.json").get<std::string>("_class_name", "") ==
             "AutoencoderKLQwenImage";
}

AutoencoderKLQwenImage load_qwenimage_vae(const io::ModelFolder& folder, torch::Device device,
                                          torch::Dtype dtype, const std::string& component) {
  auto cfg = component_config(folder, component, "AutoencoderKLQwenImage");
  AutoencoderKLQwenImage vae{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);
    vae = AutoencoderKLQwenImage(AutoencoderKLQwenImageConfig::from_json(cfg));
  }
  load_component_weights(*vae, folder, component);
  vae->to(device, dtype);
  vae->eval();
  return vae;
}

}  // namespace diffuse::models
