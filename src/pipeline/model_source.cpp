#include "pipeline/model_source.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <tuple>

#include "diffuse/errors.h"
#include "io/ldm_checkpoint.h"
#include "io/model_folder.h"
#include "io/string_affixes.h"
#include "models/autoencoder_kl.h"

namespace fs = std::filesystem;

namespace diffuse::pipeline {
namespace {

// The pipelines and component classes a Stable Diffusion folder may name in model_index.json:
// anything else (an inpainting pipeline, a UNet2DModel) would load into the wrong networks, so
// it is refused here instead of failing, or worse not failing, later.
void check_model_index(const io::ModelFolder& folder) {
  const auto& index = folder.model_index();
  const std::string pipeline = index.get<std::string>("_class_name", "");
  // The inpainting and ControlNet pipelines load the same networks (their UNet's in_channels
  // and the controlnet/ folder say the rest).
  static const char* kPipelines[] = {"StableDiffusionPipeline",
                                     "StableDiffusionImg2ImgPipeline",
                                     "StableDiffusionInpaintPipeline",
                                     "StableDiffusionControlNetPipeline",
                                     "StableDiffusionControlNetImg2ImgPipeline",
                                     "StableDiffusionControlNetInpaintPipeline",
                                     "StableDiffusionXLPipeline",
                                     "StableDiffusionXLImg2ImgPipeline",
                                     "StableDiffusionXLInpaintPipeline",
                                     "StableDiffusionXLControlNetPipeline",
                                     "StableDiffusionXLControlNetImg2ImgPipeline",
                                     "StableDiffusionXLControlNetInpaintPipeline"};
  if (!pipeline.empty() &&
      std::find(std::begin(kPipelines), std::end(kPipelines), pipeline) == std::end(kPipelines)) {
    std::string names;
    for (const char* p : kPipelines) names += std::string(names.empty() ? "" : ", ") + p;
    index.fail("_class_name", "pipeline '" + pipeline + "' is not supported (expected " + names +
                                  "; HiDream folders: HiDreamImagePipeline, FLUX: FluxPipeline)");
  }
  for (auto [component, expected, also] : {std::tuple{"unet", "UNet2DConditionModel", ""},
                                           {"vae", "AutoencoderKL", ""},
                                           {"text_encoder", "CLIPTextModel", ""},
                                           {"tokenizer", "CLIPTokenizer", "CLIPTokenizerFast"},
                                           {"text_encoder_2", "CLIPTextModelWithProjection", ""},
                                           {"tokenizer_2", "CLIPTokenizer", "CLIPTokenizerFast"}}) {
    const std::string cls = folder.component_class(component);
    if (!cls.empty() && cls != expected && cls != also)
      index.fail(component,
                 "class '" + cls + "' is not supported here (expected " + expected + ")");
  }
}

TextEncoderSource text_encoder_from_folder(const io::ModelFolder& folder,
                                           const std::string& component,
                                           const std::string& tokenizer) {
  if (!folder.has_component(tokenizer))
    throw IoError("model folder '" + folder.dir() + "' has '" + component + "' but no '" +
                  tokenizer + "' component folder");
  TextEncoderSource t;
  t.component = component;
  t.config = folder.component_config(component);
  t.tokenizer_dir = folder.component_dir(tokenizer);
  t.weights = folder.component_weights(component);
  // SDXL's second encoder projects its pooled output (the UNet's text_embeds) whatever the
  // index says; the first never does.
  t.with_projection = component == "text_encoder_2";
  return t;
}

ModelSource from_folder(const std::string& path) {
  auto folder = io::ModelFolder::open(path);
  check_model_index(folder);
  ModelSource s;
  s.path = path;
  s.kind = "diffusers";
  s.model_index = folder.model_index();
  for (const char* c : {"unet", "vae", "scheduler"})
    if (!folder.has_component(c))
      throw IoError("model folder '" + path + "' has no '" + c + "' component folder");
  // An SDXL refiner has only the second text encoder; everything else has the first.
  const bool first = folder.has_component("text_encoder"),
             second = folder.has_component("text_encoder_2");
  if (!first && !second)
    throw IoError("model folder '" + path + "' has no 'text_encoder' component folder");
  if (first)
    s.text_encoders.push_back(text_encoder_from_folder(folder, "text_encoder", "tokenizer"));
  if (second)
    s.text_encoders.push_back(text_encoder_from_folder(folder, "text_encoder_2", "tokenizer_2"));
  s.unet_config = folder.component_config("unet");
  s.vae_config = folder.component_config("vae");
  s.scheduler_config = folder.component_config("scheduler", "scheduler_config.json");
  // A GGUF UNet (`create-demo-model --weights q8_0`) keeps its quantized blocks, read at load
  // through its table as `--unet FILE.gguf` is, instead of dequantized here.
  const auto unet_path = folder.component_weights_path("unet");
  if (io::is_gguf_file(unet_path)) {
    s.unet_file = io::open_unet_file(unet_path);
    io::check_unet_file_against_config(*s.unet_file, s.unet_config.json(), s.unet_config.source());
  } else {
    s.unet_weights = folder.component_weights("unet");
  }
  s.vae_weights = folder.component_weights("vae");
  return s;
}

ModelSource from_single_file(const std::string& path, const ModelSourceOptions& options) {
  io::SingleFileOptions so;
  so.config_dir = options.config_dir;
  so.v_prediction = options.v_prediction;
  // A GGUF (stable-diffusion.cpp's all-in-one files) keeps its UNet's quantized blocks: the
  // UNet is read at load through its table instead of dequantized here.
  const bool gguf = io::is_gguf_file(path);
  so.unet_shapes_only = gguf;
  auto parts = io::load_single_file_checkpoint(path, so);
  ModelSource s;
  s.path = path;
  s.kind = "single-file";
  s.unet_config = io::JsonConfig(parts.unet_config, path + " (inferred unet config)");
  s.vae_config = io::JsonConfig(parts.vae_config, path + " (inferred vae config)");
  TextEncoderSource text;
  text.component = "text_encoder";
  text.config = io::JsonConfig(parts.text_encoder_config, path + " (inferred text_encoder config)");
  s.scheduler_config = io::JsonConfig(parts.scheduler_config, path + " (scheduler config)");
  if (gguf)
    s.unet_file = io::unet_in_checkpoint(path);
  else
    s.unet_weights = std::move(parts.unet);
  s.vae_weights = std::move(parts.vae);
  if (io::starts_with(parts.family, "sdxl")) {
    // The config folder (required for SDXL) gives both tokenizers and the pipeline's options.
    const auto folder = io::ModelFolder::open(options.config_dir);
    s.model_index = io::JsonConfig(parts.model_index, folder.model_index().source());
    if (!parts.text_encoder.empty()) {
      text.config =
          io::JsonConfig(parts.text_encoder_config, path + " (text_encoder, checked config)");
      text.weights = std::move(parts.text_encoder);
      text.tokenizer_dir = folder.component_dir("tokenizer");
      s.text_encoders.push_back(std::move(text));
    }
    TextEncoderSource text_2;
    text_2.component = "text_encoder_2";
    text_2.config =
        io::JsonConfig(parts.text_encoder_2_config, path + " (text_encoder_2, checked config)");
    text_2.weights = std::move(parts.text_encoder_2);
    text_2.tokenizer_dir = folder.component_dir("tokenizer_2");
    text_2.with_projection = true;
    s.text_encoders.push_back(std::move(text_2));
    return s;
  }
  text.weights = std::move(parts.text_encoder);
  // A checkpoint carries no tokenizer: take it from the config folder, or from a diffusers
  // folder or tokenizer/ folder next to the file.
  std::vector<fs::path> candidates;
  if (!options.config_dir.empty()) candidates.push_back(fs::path(options.config_dir) / "tokenizer");
  candidates.push_back(fs::path(path).parent_path() / "tokenizer");
  for (const auto& c : candidates)
    if (fs::exists(c / "vocab.json")) {
      text.tokenizer_dir = c.string();
      break;
    }
  if (text.tokenizer_dir.empty())
    throw IoError(
        "single-file checkpoint '" + path +
        "' carries no tokenizer: pass a diffusers folder with "
        "--config DIR (its tokenizer/ is used), or put a tokenizer/ folder next to the file");
  s.text_encoders.push_back(std::move(text));
  return s;
}

}  // namespace

namespace {

ModelSource open_model(const std::string& path, const ModelSourceOptions& options) {
  if (!fs::exists(path)) throw IoError("model '" + path + "' does not exist");
  if (fs::is_directory(path)) return from_folder(path);
  auto ext = fs::path(path).extension().string();
  if (ext == ".ckpt" || ext == ".pt" || ext == ".pth" || ext == ".bin")
    throw FormatError(
        "'" + path +
        "' is a pickled checkpoint; diffuse only reads .safetensors (convert it first)");
  return from_single_file(path, options);
}

}  // namespace

ModelSource open_model_source(const std::string& path, const ModelSourceOptions& options) {
  // The UNet file's header first: a wrong file fails before the model's weights are read.
  std::optional<io::UnetFile> unet_file;
  if (!options.unet_file.empty()) unet_file = io::open_unet_file(options.unet_file);
  auto s = open_model(path, options);
  if (unet_file) {
    io::check_unet_file_against_config(*unet_file, s.unet_config.json(), s.unet_config.source());
    s.unet_weights.clear();
    s.unet_file = std::move(unet_file);
  }
  return s;
}

int vae_scale_factor_of(const std::string& path, const std::string& config_dir) {
  namespace fs = std::filesystem;
  const bool folder = fs::is_directory(path) && fs::exists(fs::path(path) / "model_index.json");
  const std::string dir = folder ? path : config_dir;
  if (dir.empty()) return 8;
  const auto f = io::ModelFolder::open(dir);
  if (!f.has_component("vae")) return 8;
  return static_cast<int>(
      models::AutoencoderKLConfig::from_json(f.component_config("vae")).spatial_factor());
}

}  // namespace diffuse::pipeline
