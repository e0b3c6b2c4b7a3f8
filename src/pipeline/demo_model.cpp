#include "pipeline/demo_model.h"

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/autoencoder_kl.h"
#include "models/builtin_configs.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "pipeline/component_writer.h"
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

ordered_json ordered(const nlohmann::json& j) {
  return ordered_json::parse(j.dump());
}

// Writes one network's config.json and seeded random weights. LibTorch's default
// initialisation is skipped for the fast pooled one (values are random either way).
// `adjust` sets what the config file does not say (the CLIP projection comes from the class).
template <typename Model, typename Config>
void write_component(const fs::path& root, const char* folder, const ordered_json& config,
                     const char* weights_file, uint64_t seed, const DemoModelOptions& options,
                     const std::function<void(Config&)>& adjust = {}) {
  write_json_file(root / folder / "config.json", config);
  auto parsed = Config::from_json(io::JsonConfig(config, std::string("random ") + folder));
  if (adjust) adjust(parsed);
  Model model{nullptr};
  {
    nn::SkipInitGuard skip_init(torch::kFloat32);
    model = Model(parsed);
  }
  nn::init_pooled_random_weights(*model, seed);
  save_module_weights(*model, root / folder / weights_file, options.half_precision_weights,
                      "diffuse create-demo-model");
}

}  // namespace

const std::vector<std::string>& demo_prompt_corpus() {
  static const std::vector<std::string> corpus(std::begin(kCorpus), std::end(kCorpus));
  return corpus;
}

void create_demo_model(const std::string& dir, const DemoModelOptions& options) {
  torch::NoGradGuard no_grad;
  // Unknown names fail here, before anything is written.
  if (options.arch.empty())
    throw InvalidArgument(
        "create-demo-model needs --arch (sd2.1-base|sd2.1|sd1.5|sdxl); the trained "
        "demo model is made by `diffuse train-demo`");
  const models::ArchConfigs& a = models::builtin_arch(options.arch);
  fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (!fs::is_directory(root)) throw IoError("cannot create model folder '" + dir + "'");

  auto vocab = text::train_clip_bpe(demo_prompt_corpus(), options.num_merges);
  text::save_clip_tokenizer(vocab, (root / "tokenizer").string());
  const auto vocab_size = static_cast<int64_t>(vocab.tokens.size());
  const int64_t bos = vocab_size - 2, eos = vocab_size - 1;

  ordered_json te_json = ordered(a.text_encoder), unet_json = ordered(a.unet),
               vae_json = ordered(a.vae), sched_json = ordered(a.scheduler);
  // The real embedding table (49,408 rows) keeps its size; our tokenizer uses its first rows.
  te_json["bos_token_id"] = bos;
  te_json["eos_token_id"] = eos;
  te_json["pad_token_id"] = eos;
  write_component<models::ClipTextModel, models::ClipTextConfig>(
      root, "text_encoder", te_json, "model.safetensors", options.seed, options);
  auto index = stable_diffusion_model_index(
      sched_json.value("_class_name", "PNDMScheduler"),
      "random weights made by `diffuse create-demo-model --arch`; for benchmarks, not a trained "
      "model");
  if (!a.text_encoder_2.is_null()) {  // SDXL: CLIP-G with projection, the same vocabulary
    ordered_json te2_json = ordered(a.text_encoder_2);
    te2_json["bos_token_id"] = bos;
    te2_json["eos_token_id"] = eos;
    te2_json["pad_token_id"] = eos;
    write_component<models::ClipTextModel, models::ClipTextConfig>(
        root, "text_encoder_2", te2_json, "model.safetensors", options.seed + 3, options,
        [](models::ClipTextConfig& c) { c.with_projection = true; });
    text::save_clip_tokenizer(vocab, (root / "tokenizer_2").string());
    index["_class_name"] = "StableDiffusionXLPipeline";
    index["text_encoder_2"] = {"transformers", "CLIPTextModelWithProjection"};
    index["tokenizer_2"] = {"transformers", "CLIPTokenizer"};
    index["force_zeros_for_empty_prompt"] = true;
    index.erase("safety_checker");
    index.erase("requires_safety_checker");
  }
  write_component<models::UNet2DConditionModel, models::UNet2DConditionConfig>(
      root, "unet", unet_json, "diffusion_pytorch_model.safetensors", options.seed + 1, options);
  write_component<models::AutoencoderKL, models::AutoencoderKLConfig>(
      root, "vae", vae_json, "diffusion_pytorch_model.safetensors", options.seed + 2, options);
  write_json_file(root / "scheduler" / "scheduler_config.json", sched_json);
  write_json_file(root / "model_index.json", index);
}

}  // namespace diffuse::pipeline
