#include "io/ldm_checkpoint.h"
#include "io/input_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/ldm_key_map.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"

namespace fs = std::filesystem;

namespace diffuse::io {
namespace {

using ldm::TensorMap;
using json = nlohmann::json;

// Training-time state that inference never reads: the DDPM noise schedule (the scheduler
// config recomputes it), the EMA copy (model.diffusion_model holds the weights to use), the
// VAE's training loss (LPIPS / discriminator) and the v-prediction marker some tools add.
const std::set<std::string> kIgnoredKeys = {
    "betas",
    "alphas_cumprod",
    "alphas_cumprod_prev",
    "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod",
    "log_one_minus_alphas_cumprod",
    "sqrt_recip_alphas_cumprod",
    "sqrt_recipm1_alphas_cumprod",
    "posterior_variance",
    "posterior_log_variance_clipped",
    "posterior_mean_coef1",
    "posterior_mean_coef2",
    "logvar",
    "lvlb_weights",
    "v_pred",
};
const std::vector<std::string> kIgnoredPrefixes = {"model_ema.", "first_stage_model.loss."};

bool ignored(const std::string& name) {
  if (kIgnoredKeys.count(name)) return true;
  for (const auto& p : kIgnoredPrefixes)
    if (starts_with(name, p)) return true;
  return false;
}

// torch.save writes a zip archive (since 1.6) or a bare pickle; neither is safe to read.
bool looks_like_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char b[9] = {};
  in.read(reinterpret_cast<char*>(b), sizeof b);
  auto got = in.gcount();
  if (got >= 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return true;
  // A safetensors header length may start with any byte; its JSON starts at offset 8.
  if (got == 9 && b[8] == '{') return false;
  if (got >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return true;  // PROTO opcode
  std::string ext = fs::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".ckpt" || ext == ".pt" || ext == ".pth" || ext == ".bin";
}

std::optional<bool> parse_prediction(const std::string& v) {
  std::string s = v;
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "v" || s == "v_prediction" || s == "v-prediction" || s == "true") return true;
  if (s == "epsilon" || s == "eps" || s == "false") return false;
  return std::nullopt;
}

// Prediction type recorded by the tool that wrote the file: Stability's ModelSpec, kohya's
// training metadata, or a "v_pred" marker tensor.
std::optional<bool> prediction_from_file(const SafetensorsFile& file) {
  const auto& meta = file.metadata();
  for (const char* key :
       {"modelspec.prediction_type", "prediction_type", "ss_v_parameterization"}) {
    auto it = meta.find(key);
    if (it != meta.end())
      if (auto v = parse_prediction(it->second)) return v;
  }
  if (file.contains("v_pred")) return true;
  return std::nullopt;
}

void check_no_leftovers(const std::string& path, const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::string list;
  for (size_t i = 0; i < names.size() && i < 6; ++i) list += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 6) list += " and " + std::to_string(names.size() - 6) + " more";
  throw FormatError(
      path + ": " + std::to_string(names.size()) +
      " tensors are not part of the SD1.x/SD2.x/SDXL single-file layout (an unsupported "
      "variant, or a damaged file): " +
      list);
}

void collect_leftovers(const TensorMap& pool, const std::string& prefix,
                       std::vector<std::string>* out) {
  for (const auto& [name, t] : pool) out->push_back(prefix + name);
}

// The tensors of a single-file checkpoint: safetensors, or GGUF (stable-diffusion.cpp's
// all-in-one files and others with the same LDM names; quantized tensors come dequantized).
struct CheckpointTensors {
  std::vector<std::string> names;
  std::function<torch::Tensor(const std::string&)> get;
  std::function<std::vector<int64_t>(const std::string&)> shape;
  std::optional<bool> prediction;  // as recorded by the tool that wrote the file
};

CheckpointTensors open_checkpoint_tensors(const std::string& path) {
  CheckpointTensors t;
  if (is_gguf_file(path)) {
    auto file = GgufFile::open(path);
    t.names = file->names();
    t.get = [file](const std::string& name) { return file->get(name); };
    t.shape = [file](const std::string& name) { return file->info(name).shape; };
    return t;
  }
  auto file = SafetensorsFile::open(path);
  t.names = file->names();
  t.get = [file](const std::string& name) { return file->get(name); };
  t.shape = [file](const std::string& name) { return file->info(name).shape; };
  t.prediction = prediction_from_file(*file);
  return t;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

bool is_single_file_checkpoint(const std::string& path) {
  try {
    if (!fs::is_regular_file(path) || looks_like_pickle(path)) return false;
    for (const auto& name : open_checkpoint_tensors(path).names)
      if (starts_with(name, ldm::kUnetPrefix)) return true;
  } catch (const std::exception&) {
  }
  return false;
}

SingleFileComponents load_single_file_checkpoint(const std::string& path,
                                                 const SingleFileOptions& options) {
  if (!fs::exists(path)) throw IoError("single-file checkpoint '" + path + "' does not exist");
  if (fs::is_directory(path))
    throw FormatError("'" + path +
                      "' is a folder; a single-file checkpoint is one .safetensors file");
  require_regular_file(path, "single-file checkpoint");
  if (looks_like_pickle(path))
    throw FormatError(path +
                      ": a PyTorch pickle checkpoint (.ckpt/.pt/.bin); pickles can run "
                      "arbitrary code and are not read: convert it to .safetensors first");
  CheckpointTensors file;
  try {
    file = open_checkpoint_tensors(path);
  } catch (const FormatError& e) {
    throw FormatError(
        std::string(e.what()) +
        " (expected a single-file Stable Diffusion checkpoint in safetensors or GGUF format)");
  }

  TensorMap unet, vae, open_clip, clip, sdxl_clip_l, sdxl_clip_g;
  std::vector<std::string> leftovers;
  bool sdxl = false;
  for (const auto& name : file.names) {
    if (ignored(name)) continue;
    if (starts_with(name, ldm::kUnetPrefix))
      unet[name.substr(ldm::kUnetPrefix.size())] =
          options.unet_shapes_only
              ? at::empty(file.shape(name), at::TensorOptions().device(c10::DeviceType::Meta))
              : file.get(name);
    else if (starts_with(name, ldm::kVaePrefix))
      vae[name.substr(ldm::kVaePrefix.size())] = file.get(name);
    else if (starts_with(name, ldm::kOpenClipPrefix))
      open_clip[name.substr(ldm::kOpenClipPrefix.size())] = file.get(name);
    else if (starts_with(name, ldm::kClipPrefix))
      clip[name.substr(ldm::kClipPrefix.size())] = file.get(name);
    else if (starts_with(name, ldm::kSdxlClipLPrefix))
      sdxl_clip_l[name.substr(ldm::kSdxlClipLPrefix.size())] = file.get(name);
    else if (starts_with(name, ldm::kSdxlClipGPrefix))
      sdxl_clip_g[name.substr(ldm::kSdxlClipGPrefix.size())] = file.get(name);
    else if (starts_with(name, ldm::kSdxlRefinerClipGPrefix))
      sdxl_clip_g[name.substr(ldm::kSdxlRefinerClipGPrefix.size())] = file.get(name);
    else
      leftovers.push_back(name);
    sdxl = sdxl || starts_with(name, "conditioner.embedders.");
  }
  if (sdxl && options.config_dir.empty())
    throw FormatError(path +
                      ": an SDXL checkpoint (conditioner.embedders.*): give the model's diffusers "
                      "folder with --config DIR, for its configs and its two tokenizers (the "
                      "weights are checked against them)");
  if (sdxl && (!open_clip.empty() || !clip.empty()))
    throw FormatError(path +
                      ": holds both SDXL (conditioner.embedders.*) and SD1/SD2 "
                      "(cond_stage_model.*) text encoders");
  if (unet.empty())
    throw FormatError(path +
                      ": no 'model.diffusion_model.*' tensors; expected a single-file "
                      "Stable Diffusion checkpoint (original LDM layout: model.diffusion_model.*, "
                      "first_stage_model.*, cond_stage_model.*)");

  // Structure first: it decides the family, which the configs depend on.
  ldm::UnetLayout unet_layout = ldm::parse_unet_layout(unet, path);
  std::optional<ldm::VaeLayout> vae_layout;
  if (!vae.empty()) vae_layout = ldm::parse_vae_layout(vae, path);
  bool has_open_clip = !open_clip.empty();
  TensorMap& text_pool = has_open_clip ? open_clip : clip;
  std::optional<ldm::TextLayout> text_layout;
  if (!text_pool.empty()) text_layout = ldm::parse_text_layout(text_pool, has_open_clip, path);

  SingleFileComponents out;
  out.family = sdxl && !sdxl_clip_l.empty()        ? "sdxl"
               : sdxl                              ? "sdxl-refiner"
               : has_open_clip                     ? "sd2"
               : !clip.empty()                     ? "sd1"
               : unet_layout.use_linear_projection ? "sd2"
                                                   : "sd1";

  std::optional<ModelFolder> folder;
  if (!options.config_dir.empty()) folder = ModelFolder::open(options.config_dir);
  std::optional<bool> v_prediction = options.v_prediction;
  if (folder && folder->has_component("scheduler")) {
    out.scheduler_config = folder->component_config("scheduler", "scheduler_config.json").json();
    if (v_prediction)
      out.scheduler_config["prediction_type"] = *v_prediction ? "v_prediction" : "epsilon";
  } else {
    if (!v_prediction) v_prediction = file.prediction;
    out.scheduler_config = ldm::default_scheduler_config(v_prediction.value_or(false));
  }
  bool v_pred = out.scheduler_config.value("prediction_type", "epsilon") == "v_prediction";

  std::vector<std::string> assumed;
  // A folder's config replaces the inferred one once it agrees on everything shapes determine.
  auto choose = [&](const std::string& component, json inferred,
                    const std::vector<std::string>& keys) -> json {
    if (!folder) return inferred;
    JsonConfig given = folder->component_config(component);
    ldm::check_config_against_weights(given.json(), inferred, keys, given.source(), path);
    return given.json();
  };

  // The inference gives a level without attention the middle block's depth, where SDXL's
  // configs write 1 (an unused value): its other shape keys are compared.
  std::vector<std::string> unet_keys = ldm::unet_shape_keys();
  if (sdxl)
    unet_keys.erase(std::remove(unet_keys.begin(), unet_keys.end(), "transformer_layers_per_block"),
                    unet_keys.end());
  out.unet_config = choose(
      "unet", ldm::infer_unet_config(unet_layout, sdxl ? "sd2" : out.family, v_pred, &assumed),
      unet_keys);
  out.unet = ldm::map_unet(unet, unet_layout, path);
  collect_leftovers(unet, ldm::kUnetPrefix, &leftovers);

  if (vae_layout) {
    out.vae_config = choose("vae", ldm::infer_vae_config(*vae_layout, out.family, v_pred, &assumed),
                            ldm::vae_shape_keys());
    out.vae = ldm::map_vae(vae, *vae_layout, path);
    collect_leftovers(vae, ldm::kVaePrefix, &leftovers);
  }

  if (text_layout) {
    int in_file = text_layout->layers_in_file;
    // SD2 runs all but the last layer of the OpenCLIP tower (see ldm_checkpoint.h).
    int layers = in_file - (has_open_clip && text_layout->has_text_projection ? 1 : 0);
    if (folder) {
      JsonConfig given = folder->component_config("text_encoder");
      int want = given.require<int>("num_hidden_layers");
      if (want != in_file && !(has_open_clip && want == in_file - 1))
        throw ConfigError(given.source() + ": num_hidden_layers is " + std::to_string(want) +
                          " but " + path + " has " + std::to_string(in_file) +
                          " text encoder layers" +
                          (has_open_clip ? " (one more is allowed: SD2 "
                                           "skips the last layer)"
                                         : ""));
      layers = want;
    }
    if (layers < 1) throw FormatError(path + ": the text encoder has no usable layers");
    out.text_encoder_config =
        choose("text_encoder", ldm::infer_text_config(*text_layout, layers, &assumed),
               ldm::text_shape_keys());
    out.text_encoder = ldm::map_text(text_pool, *text_layout, layers, path);
    collect_leftovers(text_pool, has_open_clip ? ldm::kOpenClipPrefix : ldm::kClipPrefix,
                      &leftovers);
  }
  if (has_open_clip) collect_leftovers(clip, ldm::kClipPrefix, &leftovers);
  if (sdxl) {
    out.model_index = folder->model_index().json();
    // Both encoders keep every layer (SDXL reads the penultimate hidden state of each).
    auto encoder = [&](TensorMap& pool, bool open_clip, const std::string& prefix,
                       const std::string& component, json* config) {
      const auto layout = ldm::parse_text_layout(pool, open_clip, path, prefix);
      JsonConfig given = folder->component_config(component);
      const int want = given.require<int>("num_hidden_layers");
      if (want != layout.layers_in_file)
        throw ConfigError(given.source() + ": num_hidden_layers is " + std::to_string(want) +
                          " but " + path + " has " + std::to_string(layout.layers_in_file) +
                          " layers under '" + prefix + "'");
      *config =
          choose(component, ldm::infer_text_config(layout, want, &assumed), ldm::text_shape_keys());
      auto mapped = ldm::map_text(pool, layout, want, path, /*with_projection=*/open_clip);
      collect_leftovers(pool, prefix, &leftovers);
      return mapped;
    };
    if (!sdxl_clip_l.empty())
      out.text_encoder = encoder(sdxl_clip_l, false, ldm::kSdxlClipLPrefix, "text_encoder",
                                 &out.text_encoder_config);
    if (sdxl_clip_g.empty())
      throw FormatError(path + ": an SDXL checkpoint without its OpenCLIP ViT-bigG text encoder (" +
                        ldm::kSdxlClipGPrefix + "*)");
    out.text_encoder_2 =
        encoder(sdxl_clip_g, true,
                out.family == "sdxl" ? ldm::kSdxlClipGPrefix : ldm::kSdxlRefinerClipGPrefix,
                "text_encoder_2", &out.text_encoder_2_config);
  }
  check_no_leftovers(path, leftovers);

  if (!folder) out.assumed = std::move(assumed);
  return out;
}

}  // namespace diffuse::io
