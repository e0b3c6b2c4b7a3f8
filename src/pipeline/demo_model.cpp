#include "pipeline/demo_model.h"

#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/arch_configs.h"
#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "text/bpe_trainer.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace diffuse::pipeline {
namespace {

// Text the demo tokenizer learns its merges from: the kind of words prompts are made of.
const char* const kCorpus[] = {
    "a photograph of an astronaut riding a horse on the moon",
    "a watercolor painting of a fox in the snow",
    "a cozy cabin in the mountains at sunset, warm light in the windows",
    "portrait of an old sailor with a grey beard, oil painting, dramatic lighting",
    "a bowl of ramen with a soft boiled egg, studio photo, shallow depth of field",
    "a futuristic city at night with neon signs and flying cars, cinematic",
    "a red sports car parked on a wet street, reflections, high detail",
    "an ancient castle on a misty hill at sunrise, volumetric light",
    "a cat sleeping on a stack of books next to a window, soft morning light",
    "a lighthouse on a rocky coast during a storm, crashing waves",
    "a field of sunflowers under a blue sky with white clouds",
    "a dragon flying over a medieval village, fantasy art, highly detailed",
    "a close up photo of a hummingbird drinking from a flower",
    "a minimalist living room with large windows and plants, interior design",
    "a forest path in autumn with orange and yellow leaves",
    "a robot playing chess in a park, digital art",
    "a plate of pancakes with blueberries and maple syrup, food photography",
    "a snowy mountain peak reflected in a calm lake, landscape photography",
    "an underwater scene with coral reefs and tropical fish, vibrant colors",
    "a steampunk airship above the clouds, intricate brass details",
    "a black and white photo of a busy train station in the rain",
    "a golden retriever puppy running through a meadow, sharp focus",
    "a bustling market street in marrakech, colorful fabrics and spices",
    "a desert landscape with sand dunes and a starry night sky, milky way",
    "a still life of apples, pears and grapes on a wooden table, renaissance style",
    "a small wooden boat on a river in a green valley, peaceful, morning fog",
    "a knight in shining armor holding a sword, concept art, trending on artstation",
    "a tiny house made of mushrooms in an enchanted forest, whimsical illustration",
    "a vintage poster of a beach resort, bold colors, art deco",
    "an astronaut floating in space with the earth in the background, realistic",
    "blurry, low quality, ugly, deformed, watermark, text, signature, bad anatomy",
    "best quality, masterpiece, ultra realistic, 8k resolution, sharp, detailed",
};

ordered_json text_encoder_config(int64_t vocab_size, int64_t bos, int64_t eos) {
  return {{"architectures", {"CLIPTextModel"}},
          {"model_type", "clip_text_model"},
          {"hidden_act", "gelu"},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_attention_heads", 4},
          {"num_hidden_layers", 2},
          {"layer_norm_eps", 1e-5},
          {"max_position_embeddings", 77},
          {"vocab_size", vocab_size},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"pad_token_id", eos},
          {"projection_dim", 64},
          {"torch_dtype", "float32"}};
}

ordered_json unet_config() {
  return {{"_class_name", "UNet2DConditionModel"},
          {"act_fn", "silu"},
          {"attention_head_dim", {2, 4, 4}},
          {"block_out_channels", {32, 64, 64}},
          {"center_input_sample", false},
          {"cross_attention_dim", 64},
          {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}},
          {"downsample_padding", 1},
          {"flip_sin_to_cos", true},
          {"freq_shift", 0},
          {"in_channels", 4},
          {"layers_per_block", 1},
          {"mid_block_scale_factor", 1},
          {"norm_eps", 1e-5},
          {"norm_num_groups", 8},
          {"out_channels", 4},
          {"sample_size", 32},
          {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
          {"upcast_attention", false},
          {"use_linear_projection", true}};
}

ordered_json vae_config() {
  return {
      {"_class_name", "AutoencoderKL"},
      {"act_fn", "silu"},
      {"block_out_channels", {32, 64, 64, 64}},
      {"down_block_types",
       {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"in_channels", 3},
      {"latent_channels", 4},
      {"layers_per_block", 1},
      {"norm_num_groups", 8},
      {"out_channels", 3},
      {"sample_size", 256},
      {"scaling_factor", 0.18215},
      {"up_block_types",
       {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}}};
}

ordered_json scheduler_config() {
  return {{"_class_name", "PNDMScheduler"},
          {"beta_end", 0.012},
          {"beta_schedule", "scaled_linear"},
          {"beta_start", 0.00085},
          {"clip_sample", false},
          {"num_train_timesteps", 1000},
          {"prediction_type", "epsilon"},
          {"set_alpha_to_one", false},
          {"skip_prk_steps", true},
          {"steps_offset", 1},
          {"trained_betas", nullptr}};
}

void write_json(const fs::path& path, const ordered_json& j) {
  fs::create_directories(path.parent_path());
  io::write_file_atomically(path.string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

ordered_json ordered(const nlohmann::json& j) {
  return ordered_json::parse(j.dump());
}

void save_module(torch::nn::Module& module, const fs::path& path, bool half) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters(true))
    tensors.emplace_back(p.key(), half ? p.value().to(torch::kFloat16) : p.value());
  io::save_safetensors(path.string(), tensors,
                       {{"format", "pt"}, {"made_by", "diffuse create-demo-model"}});
}

// Writes one network's config.json and seeded random weights. Full-size models skip
// LibTorch's default initialisation and take the fast pooled one (values are random either
// way); the small demo keeps its original stream of values.
template <typename Model, typename Config>
void write_component(const fs::path& root, const char* folder, const ordered_json& config,
                     const char* weights_file, uint64_t seed, const DemoModelOptions& options) {
  write_json(root / folder / "config.json", config);
  const auto parsed = Config::from_json(io::JsonConfig(config, std::string("demo ") + folder));
  Model model{nullptr};
  if (options.arch.empty()) {
    model = Model(parsed);
    nn::init_random_weights(*model, seed);
  } else {
    {
      nn::SkipInitGuard skip_init(torch::kFloat32);
      model = Model(parsed);
    }
    nn::init_pooled_random_weights(*model, seed);
  }
  save_module(*model, root / folder / weights_file, options.half_precision_weights);
}

}  // namespace

void create_demo_model(const std::string& dir, const DemoModelOptions& options) {
  torch::NoGradGuard no_grad;
  // Unknown names fail here, before anything is written.
  const bench::ArchConfigs* arch =
      options.arch.empty() ? nullptr : &bench::builtin_arch(options.arch);
  fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (!fs::is_directory(root)) throw IoError("cannot create model folder '" + dir + "'");

  std::vector<std::string> corpus(std::begin(kCorpus), std::end(kCorpus));
  auto vocab = text::train_clip_bpe(corpus, options.num_merges);
  text::save_clip_tokenizer(vocab, (root / "tokenizer").string());
  const auto vocab_size = static_cast<int64_t>(vocab.tokens.size());
  const int64_t bos = vocab_size - 2, eos = vocab_size - 1;

  ordered_json te_json, unet_json, vae_json, sched_json;
  if (options.arch.empty()) {
    te_json = text_encoder_config(vocab_size, bos, eos);
    unet_json = unet_config();
    vae_json = vae_config();
    sched_json = scheduler_config();
  } else {
    const auto& a = *arch;
    te_json = ordered(a.text_encoder);
    unet_json = ordered(a.unet);
    vae_json = ordered(a.vae);
    sched_json = ordered(a.scheduler);
    // The real embedding table (49,408 rows) keeps its size; our tokenizer uses its first rows.
    te_json["bos_token_id"] = bos;
    te_json["eos_token_id"] = eos;
    te_json["pad_token_id"] = eos;
  }
  write_component<models::ClipTextModel, models::ClipTextConfig>(
      root, "text_encoder", te_json, "model.safetensors", options.seed, options);
  write_component<models::UNet2DConditionModel, models::UNet2DConditionConfig>(
      root, "unet", unet_json, "diffusion_pytorch_model.safetensors", options.seed + 1, options);
  write_component<models::AutoencoderKL, models::AutoencoderKLConfig>(
      root, "vae", vae_json, "diffusion_pytorch_model.safetensors", options.seed + 2, options);
  write_json(root / "scheduler" / "scheduler_config.json", sched_json);
  write_json(
      root / "model_index.json",
      {{"_class_name", "StableDiffusionPipeline"},
       {"_diffuse_note", "random weights made by `diffuse create-demo-model`; not a trained model"},
       {"scheduler", {"diffusers", sched_json.value("_class_name", "PNDMScheduler")}},
       {"text_encoder", {"transformers", "CLIPTextModel"}},
       {"tokenizer", {"transformers", "CLIPTokenizer"}},
       {"unet", {"diffusers", "UNet2DConditionModel"}},
       {"vae", {"diffusers", "AutoencoderKL"}},
       {"safety_checker", {nullptr, nullptr}},
       {"feature_extractor", {nullptr, nullptr}},
       {"requires_safety_checker", false}});
}

}  // namespace diffuse::pipeline
