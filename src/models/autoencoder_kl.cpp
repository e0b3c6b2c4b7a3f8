#include "models/autoencoder_kl.h"

#include <torch/torch.h>

#include <sstream>

#include "diffuse/errors.h"
#include "models/config_values.h"
#include "models/load_component.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::models {
namespace {

void check_block_types(const io::JsonConfig& cfg, const std::string& key,
                       const std::vector<std::string>& types, const std::string& known, size_t n) {
  for (const auto& t : types)
    if (t != known) cfg.fail(key, "unknown block type '" + t + "' (supported: " + known + ")");
  if (types.size() != n)
    cfg.fail(key, "has " + std::to_string(types.size()) + " entries but block_out_channels has " +
                      std::to_string(n));
}

}  // namespace

AutoencoderKLConfig AutoencoderKLConfig::from_json(const io::JsonConfig& cfg) {
  AutoencoderKLConfig c;
  c.source = cfg.source();
  c.in_channels = read_int_in(cfg, "in_channels", 3, 1, kMaxConfigDim);
  c.out_channels = read_int_in(cfg, "out_channels", 3, 1, kMaxConfigDim);
  c.block_out_channels = read_int_list(cfg, "block_out_channels");
  const size_t n = c.block_out_channels.size();
  c.down_block_types = read_string_list(cfg, "down_block_types", {"DownEncoderBlock2D"});
  c.up_block_types = read_string_list(cfg, "up_block_types", {"UpDecoderBlock2D"});
  check_block_types(cfg, "down_block_types", c.down_block_types, "DownEncoderBlock2D", n);
  check_block_types(cfg, "up_block_types", c.up_block_types, "UpDecoderBlock2D", n);
  c.layers_per_block = read_int_in(cfg, "layers_per_block", 1, 1, kMaxConfigLayers);
  c.act_fn = cfg.get<std::string>("act_fn", "silu");
  nn::parse_activation(c.act_fn, c.source + ": key 'act_fn'");
  c.latent_channels = read_int_in(cfg, "latent_channels", 4, 1, kMaxConfigDim);
  c.norm_num_groups = read_int_in(cfg, "norm_num_groups", 32, 1, kMaxConfigDim);
  for (size_t i = 0; i < n; ++i)
    if (c.block_out_channels[i] % c.norm_num_groups != 0)
      cfg.fail("norm_num_groups",
               std::to_string(c.norm_num_groups) + " groups do not divide block_out_channels[" +
                   std::to_string(i) + "] = " + std::to_string(c.block_out_channels[i]));
  c.sample_size = read_size(cfg, "sample_size", kMaxImageSide);
  // 0 or a negative factor turns every latent into the same image (black, for 0).
  c.scaling_factor = read_positive_number(cfg, "scaling_factor", 0.18215, 1e4);
  if (cfg.has("shift_factor")) c.shift_factor = read_number_in(cfg, "shift_factor", 0, -1e4, 1e4);
  c.force_upcast = cfg.get<bool>("force_upcast", true);
  c.use_quant_conv = cfg.get<bool>("use_quant_conv", true);
  c.use_post_quant_conv = cfg.get<bool>("use_post_quant_conv", true);
  c.mid_block_add_attention = cfg.get<bool>("mid_block_add_attention", true);
  return c;
}

torch::Tensor AutoencoderKLConfig::to_latents(const torch::Tensor& z) const {
  return (z - shift_factor.value_or(0.0)) * scaling_factor;
}

torch::Tensor AutoencoderKLConfig::from_latents(const torch::Tensor& latents) const {
  return latents / scaling_factor + shift_factor.value_or(0.0);
}

int64_t AutoencoderKLConfig::spatial_factor() const {
  return int64_t{1} << (block_out_channels.size() - 1);
}

AutoencoderKLImpl::AutoencoderKLImpl(AutoencoderKLConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  VaeCoderOptions o;
  o.block_out_channels = c.block_out_channels;
  o.layers_per_block = c.layers_per_block;
  o.norm_num_groups = c.norm_num_groups;
  o.act = nn::parse_activation(c.act_fn, c.source + ": key 'act_fn'");
  o.mid_block_add_attention = c.mid_block_add_attention;

  VaeCoderOptions enc = o;
  enc.in_channels = c.in_channels;
  enc.out_channels = c.latent_channels;
  encoder = register_module("encoder", Encoder(enc));
  VaeCoderOptions dec = o;
  dec.in_channels = c.latent_channels;
  dec.out_channels = c.out_channels;
  decoder = register_module("decoder", Decoder(dec));
  const int64_t lc = c.latent_channels;
  if (c.use_quant_conv)
    quant_conv =
        register_module("quant_conv", nn::make_conv2d(torch::nn::Conv2dOptions(2 * lc, 2 * lc, 1)));
  if (c.use_post_quant_conv)
    post_quant_conv =
        register_module("post_quant_conv", nn::make_conv2d(torch::nn::Conv2dOptions(lc, lc, 1)));
}

LatentDist LatentDist::from_moments(const torch::Tensor& moments) {
  auto halves = moments.chunk(2, 1);
  LatentDist d;
  d.mean = halves[0];
  d.logvar = halves[1].clamp(-30.0, 20.0);
  d.std = torch::exp(0.5 * d.logvar);
  return d;
}

LatentDist AutoencoderKLImpl::encode(const torch::Tensor& x, Intermediates* intermediates) {
  return LatentDist::from_moments(encode_moments(x, intermediates));
}

torch::Tensor AutoencoderKLImpl::encode_moments(const torch::Tensor& x,
                                                Intermediates* intermediates) {
  const auto& c = config_;
  const std::string who = "AutoencoderKL.encode (" + c.source + "): ";
  if (!x.defined() || x.dim() != 4)
    throw InvalidArgument(who + "image must be 4-D [batch, channels, height, width], got " +
                          (x.defined() ? c10::str(x.sizes()) : std::string("no tensor")));
  if (x.size(1) != c.in_channels)
    throw InvalidArgument(who + "image has " + std::to_string(x.size(1)) +
                          " channels, expected in_channels = " + std::to_string(c.in_channels));
  const int64_t f = c.spatial_factor();
  if (x.size(2) % f != 0 || x.size(3) % f != 0)
    throw InvalidArgument(who + "image height and width must be multiples of " + std::to_string(f) +
                          ", got " + std::to_string(x.size(2)) + "x" + std::to_string(x.size(3)));

  // Inputs follow the model's device and compute dtype (a no-op when they already match).
  const auto& w = nn::compute_reference(*encoder->conv_in);
  auto moments = encoder(x.to(w.device(), w.scalar_type()), intermediates, "encoder.");
  if (quant_conv) {
    moments = quant_conv(moments);
    capture(intermediates, "quant_conv", moments);
  }
  return moments;
}

torch::Tensor AutoencoderKLImpl::decode(const torch::Tensor& z_in, Intermediates* intermediates) {
  const auto& c = config_;
  const std::string who = "AutoencoderKL.decode (" + c.source + "): ";
  if (!z_in.defined() || z_in.dim() != 4)
    throw InvalidArgument(who + "latents must be 4-D [batch, channels, height, width], got " +
                          (z_in.defined() ? c10::str(z_in.sizes()) : std::string("no tensor")));
  if (z_in.size(1) != c.latent_channels)
    throw InvalidArgument(
        who + "latents have " + std::to_string(z_in.size(1)) +
        " channels, expected latent_channels = " + std::to_string(c.latent_channels));
  const auto& w = nn::compute_reference(*decoder->conv_in);
  auto z = z_in.to(w.device(), w.scalar_type());
  if (post_quant_conv) {
    z = post_quant_conv(z);
    capture(intermediates, "post_quant_conv", z);
  }
  return decoder(z, intermediates, "decoder.");
}

AutoencoderKL load_vae(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                       const std::string& component) {
  auto cfg = component_config(folder, component, "AutoencoderKL");
  AutoencoderKL model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = AutoencoderKL(AutoencoderKLConfig::from_json(cfg));
  }
  load_component_weights(*model, folder, component);
  model->to(device, dtype);
  nn::use_compute_layout(*model, /*cuda_channels_last=*/false);
  model->eval();
  return model;
}

}  // namespace diffuse::models
