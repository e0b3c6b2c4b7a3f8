#include "models/hidream_transformer.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <tuple>

#include "accel/dit_block_loop.h"
#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "models/load_component.h"
#include "nn/layers.h"
#include "nn/rope.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"

namespace diffuse::models {
namespace {

constexpr double kRopeTheta = 10000.0;
constexpr int64_t kTimestepChannels = 256;

// An attribute-only module level of diffusers' tree (t_embedder, x_embedder, ...).
std::shared_ptr<torch::nn::Module> holder(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

std::string shape(const torch::Tensor& t) {
  return c10::str(t.sizes());
}

// [B, C, H, W] -> [B, (H/p)*(W/p), p*p*C]: tokens row-major, features ordered (py, px, c).
torch::Tensor patchify(const torch::Tensor& x, int64_t p) {
  const int64_t B = x.size(0), C = x.size(1), pH = x.size(2) / p, pW = x.size(3) / p;
  return x.reshape({B, C, pH, p, pW, p})
      .permute({0, 2, 4, 3, 5, 1})
      .reshape({B, pH * pW, p * p * C});
}

// The inverse for the first pH*pW tokens of [B, S, p*p*C].
torch::Tensor unpatchify(const torch::Tensor& tokens, int64_t p, int64_t pH, int64_t pW) {
  const int64_t B = tokens.size(0), C = tokens.size(2) / (p * p);
  return tokens.narrow(1, 0, pH * pW)
      .reshape({B, pH, pW, p, p, C})
      .permute({0, 5, 1, 3, 2, 4})
      .reshape({B, C, pH * p, pW * p});
}

}  // namespace

nn::RopeTable hidream_image_rope(const HiDreamTransformerConfig& config, int64_t pH, int64_t pW,
                                 const torch::Device& device) {
  auto rows = torch::arange(pH, torch::kFloat32).view({pH, 1}).expand({pH, pW});
  auto cols = torch::arange(pW, torch::kFloat32).view({1, pW}).expand({pH, pW});
  auto ids = torch::stack({torch::zeros({pH, pW}), rows, cols}, -1).reshape({pH * pW, 3});
  return nn::rope_table(ids, config.axes_dims_rope, kRopeTheta, device);
}

nn::HiDreamBlockOptions HiDreamTransformerConfig::block_options() const {
  nn::HiDreamBlockOptions bo;
  bo.dim = inner_dim();
  bo.heads = num_attention_heads;
  bo.head_dim = attention_head_dim;
  bo.num_routed_experts = num_routed_experts;
  bo.num_activated_experts = num_activated_experts;
  return bo;
}

HiDreamImageTransformer2DModelImpl::HiDreamImageTransformer2DModelImpl(
    HiDreamTransformerConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t D = c.inner_dim();
  auto t_embedder = holder(*this, "t_embedder");
  time_proj = t_embedder->register_module(
      "time_proj", nn::Timesteps(kTimestepChannels, /*flip_sin_to_cos=*/true, 0.0));
  timestep_embedder = t_embedder->register_module(
      "timestep_embedder", nn::TimestepEmbedding(kTimestepChannels, D, nn::Activation::kSilu));
  pooled_embedder =
      holder(*this, "p_embedder")
          ->register_module("pooled_embedder",
                            nn::TimestepEmbedding(c.text_emb_dim, D, nn::Activation::kSilu));
  x_proj = holder(*this, "x_embedder")
               ->register_module("proj",
                                 nn::make_linear(c.in_channels * c.patch_size * c.patch_size, D));

  const auto bo = c.block_options();
  auto doubles = register_module("double_stream_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto wrapper = std::make_shared<torch::nn::Module>();
    double_blocks.push_back(
        wrapper->register_module("block", nn::HiDreamImageTransformerBlock(bo)));
    doubles->push_back(wrapper);
  }
  auto singles = register_module("single_stream_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    auto wrapper = std::make_shared<torch::nn::Module>();
    single_blocks.push_back(
        wrapper->register_module("block", nn::HiDreamImageSingleTransformerBlock(bo)));
    singles->push_back(wrapper);
  }

  auto final_layer = holder(*this, "final_layer");
  final_linear = final_layer->register_module(
      "linear", nn::make_linear(D, c.patch_size * c.patch_size * c.out_channels));
  final_modulation = nn::make_linear(D, 2 * D);
  final_layer->register_module("adaLN_modulation",
                               torch::nn::Sequential(torch::nn::SiLU(), final_modulation));

  // One projection per block's Llama layer, then T5's.
  auto captions = register_module("caption_projection", torch::nn::ModuleList());
  const int64_t blocks = c.num_layers + c.num_single_layers;
  for (int64_t i = 0; i <= blocks; ++i) {
    const int64_t in = i < blocks ? c.caption_channels[1] : c.caption_channels[0];
    auto wrapper = std::make_shared<torch::nn::Module>();
    caption_linear.push_back(wrapper->register_module(
        "linear", nn::make_linear(torch::nn::LinearOptions(in, D).bias(false))));
    captions->push_back(wrapper);
  }
}

void HiDreamImageTransformer2DModelImpl::check_inputs(
    const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& t5,
    const torch::Tensor& llama, const torch::Tensor& pooled, int64_t max_seq) const {
  const auto& c = config_;
  const std::string who = "HiDreamImageTransformer2DModel: ";
  if (x.dim() != 4 || x.size(1) != c.in_channels || x.size(0) == 0)
    throw InvalidArgument(who + "hidden_states must be [B, " + std::to_string(c.in_channels) +
                          ", H, W], got " + shape(x));
  const int64_t B = x.size(0), p = c.patch_size;
  if (x.size(2) % p != 0 || x.size(3) % p != 0 || x.size(2) == 0 || x.size(3) == 0)
    throw InvalidArgument(who +
                          "latent height and width must be positive multiples of the patch "
                          "size " +
                          std::to_string(p) + ", got " + shape(x));
  const int64_t tokens = (x.size(2) / p) * (x.size(3) / p);
  if (tokens > max_seq)
    throw InvalidArgument(
        who + "a " + std::to_string(x.size(2)) + "x" + std::to_string(x.size(3)) + " latent has " +
        std::to_string(tokens) + " image tokens, more than the " + std::to_string(max_seq) +
        " the model allows (max_resolution " + std::to_string(c.max_resolution[0]) + "x" +
        std::to_string(c.max_resolution[1]) + " latent pixels in " + c.source + ")");
  if (timesteps.numel() != 1 && timesteps.numel() != B)
    throw InvalidArgument(who + "timesteps must hold 1 or " + std::to_string(B) + " values, got " +
                          shape(timesteps));
  if (t5.dim() != 3 || t5.size(0) != B || t5.size(2) != c.caption_channels[0])
    throw InvalidArgument(who + "the T5 hidden states must be [" + std::to_string(B) + ", L, " +
                          std::to_string(c.caption_channels[0]) + "], got " + shape(t5));
  const int64_t needed = *std::max_element(c.llama_layers.begin(), c.llama_layers.end()) + 1;
  if (llama.dim() != 4 || llama.size(0) < needed || llama.size(1) != B ||
      llama.size(3) != c.caption_channels[1])
    throw InvalidArgument(who +
                          "the Llama hidden states must be [layers >= " + std::to_string(needed) +
                          " (llama_layers), " + std::to_string(B) + ", L, " +
                          std::to_string(c.caption_channels[1]) + "], got " + shape(llama));
  if (pooled.dim() != 2 || pooled.size(0) != B || pooled.size(1) != c.text_emb_dim)
    throw InvalidArgument(who + "pooled_embeds must be [" + std::to_string(B) + ", " +
                          std::to_string(c.text_emb_dim) + "], got " + shape(pooled));
}

torch::Tensor HiDreamImageTransformer2DModelImpl::forward(
    const torch::Tensor& hidden_states, const torch::Tensor& timesteps, const torch::Tensor& t5_in,
    const torch::Tensor& llama_in, const torch::Tensor& pooled_in,
    const HiDreamForwardOptions& options, Intermediates* inter) {
  const auto& c = config_;
  if (options.max_seq < 0)
    throw InvalidArgument("HiDreamImageTransformer2DModel: max_seq must not be negative");
  const int64_t max_seq = options.max_seq > 0 ? options.max_seq : c.max_seq();
  check_inputs(hidden_states, timesteps, t5_in, llama_in, pooled_in, max_seq);
  if (options.sequence_group && inter)
    throw InvalidArgument(
        "HiDreamImageTransformer2DModel: intermediates are captured on one device, not under "
        "sequence parallelism");
  const auto& w = x_proj->weight;
  const auto dev = w.device();
  const auto dtype = w.scalar_type();
  auto x = hidden_states.to(dev, dtype);
  const int64_t B = x.size(0), p = c.patch_size, pH = x.size(2) / p, pW = x.size(3) / p;
  const int64_t n_img = pH * pW;

  // Square latents run as they are; non-square ones are padded to max_seq tokens (diffusers'
  // two code paths; padding changes the result through the key mask, so it is kept).
  auto patches = patchify(x, p);
  nn::HiDreamBlockInputs in;
  if (x.size(2) != x.size(3) && max_seq > n_img) {
    patches = torch::constant_pad_nd(patches, {0, 0, 0, max_seq - n_img});
    in.image_token_mask = torch::zeros({B, max_seq}, x.options());
    in.image_token_mask.narrow(1, 0, n_img).fill_(1);
  }

  auto t = timesteps.to(dev).reshape({-1}).expand({B});
  auto t_emb = timestep_embedder(time_proj(t).to(dtype));
  capture(inter, "t_embedder", t_emb);
  auto p_emb = pooled_embedder(pooled_in.to(dev, dtype));
  capture(inter, "p_embedder", p_emb);
  in.adaln_input = t_emb + p_emb;

  // Ulysses: this rank embeds and carries its share of the image tokens (padding included).
  std::optional<parallel::UlyssesShard> ulysses;
  if (options.sequence_group) {
    ulysses.emplace(*options.sequence_group, c.num_attention_heads, patches.size(1));
    patches = ulysses->local_rows(patches);
    in.ulysses = &*ulysses;
    if (options.cache)
      options.cache->set_rank_sum(parallel::sum_over_ranks(*options.sequence_group));
  }
  auto image = x_proj(patches);
  capture(inter, "x_embedder", image);

  // Text: the projected Llama layer of every block, then T5.
  const int64_t blocks = c.num_layers + c.num_single_layers;
  std::vector<torch::Tensor> llama_proj;
  for (int64_t i = 0; i < blocks; ++i) {
    llama_proj.push_back(caption_linear[i](llama_in[c.llama_layers[i]].to(dev, dtype)));
    capture(inter, "caption_projection." + std::to_string(i), llama_proj.back());
  }
  auto t5 = caption_linear[blocks](t5_in.to(dev, dtype));
  capture(inter, "caption_projection." + std::to_string(blocks), t5);
  auto text = torch::cat({t5, llama_proj.back()}, 1);
  const int64_t text_len = text.size(1);

  // RoPE over (frame, row, col); padding and text tokens sit at (0, 0, 0): the identity.
  const auto rope = hidream_image_rope(c, pH, pW, dev);
  in.rope = &rope;
  if (inter) {
    const int64_t total = image.size(1) + text_len + llama_proj.front().size(1);
    capture(inter, "pe_embedder",
            nn::rope_table_as_matrices(rope, total).expand({B, -1, -1, -1, -1, -1}));
  }

  const auto streamed = [&](int64_t block, auto run) {
    if (stream) stream->before(static_cast<size_t>(block));
    run();
    if (stream) stream->after(static_cast<size_t>(block));
  };
  // Each block appends "its" projected Llama layer to the text for one block and drops it again.
  const int64_t image_len = image.size(1);
  int64_t joint_len = 0;
  accel::DitBlockLoop loop;
  loop.dual_blocks = c.num_layers;
  loop.single_blocks = c.num_single_layers;
  loop.dual = [&](int64_t i, const torch::Tensor& img_in, const torch::Tensor& txt_in) {
    torch::Tensor img, txt;
    streamed(i, [&] {
      std::tie(img, txt) = double_blocks[i](img_in, torch::cat({txt_in, llama_proj[i]}, 1), in);
    });
    capture(inter, "double_stream_blocks." + std::to_string(i) + ".image", img);
    capture(inter, "double_stream_blocks." + std::to_string(i) + ".text", txt);
    return std::make_pair(img, txt.narrow(1, 0, text_len));
  };
  loop.join = [&](const torch::Tensor& img, const torch::Tensor& txt) {
    auto tokens = torch::cat({img, txt}, 1);
    joint_len = tokens.size(1);
    return tokens;
  };
  loop.single = [&](int64_t j, const torch::Tensor& tokens) {
    const int64_t b = c.num_layers + j;
    torch::Tensor out;
    streamed(b, [&] { out = single_blocks[j](torch::cat({tokens, llama_proj[b]}, 1), in); });
    capture(inter, "single_stream_blocks." + std::to_string(j), out);
    return out.narrow(1, 0, joint_len);
  };
  loop.image_of = [&](const torch::Tensor& tokens) { return tokens.narrow(1, 0, image_len); };
  // The blocks, unless a cache skips some or all of them (accel/dit_cache.h).
  const auto image_final = accel::run_dit_blocks(loop, options.cache, image, text);

  auto mod = final_modulation(torch::silu(in.adaln_input)).unsqueeze(1).chunk(2, -1);
  auto out = final_linear(nn::hidream_modulate(image_final, mod[0], mod[1]));
  if (ulysses) out = ulysses->gather_rows(out);
  capture(inter, "final_layer", out);
  return unpatchify(out, p, pH, pW);
}

HiDreamImageTransformer2DModel load_hidream_transformer(const io::ModelFolder& folder,
                                                        torch::Device device, torch::Dtype dtype,
                                                        const std::string& component, bool stream,
                                                        std::optional<quant::GgmlType> weight_type,
                                                        nn::QuantizedLayers* quantized) {
  auto cfg = component_config(folder, component, "HiDreamImageTransformer2DModel");
  HiDreamImageTransformer2DModel model{nullptr};
  {
    // Every parameter is loaded below; a quantized layer never holds its plain weight.
    nn::SkipInitGuard skip_init(dtype, nn::SkipInitGuard::Weights::kDeferred);
    model = HiDreamImageTransformer2DModel(HiDreamTransformerConfig::from_json(cfg));
  }
  model->eval();
  if (stream && (weight_type || component_is_gguf(folder, component)))
    throw InvalidArgument(
        "weight streaming reads plain weights from safetensors files; not with quantized "
        "weights (--weights or a GGUF transformer)");
  if (!stream) {
    load_component_weights_to(*model, folder, component, weight_type, device, dtype, quantized);
    return model;
  }
  std::vector<std::string> prefixes;
  for (size_t i = 0; i < model->double_blocks.size(); ++i)
    prefixes.push_back("double_stream_blocks." + std::to_string(i) + ".");
  for (size_t i = 0; i < model->single_blocks.size(); ++i)
    prefixes.push_back("single_stream_blocks." + std::to_string(i) + ".");
  model->stream = load_component_streamed(*model, folder, component, prefixes, device, dtype);
  return model;
}

}  // namespace diffuse::models
