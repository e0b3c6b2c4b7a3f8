#include "pipeline/memory_plan_folder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/ldm_checkpoint.h"
#include "io/string_affixes.h"
#include "models/load_component.h"
#include "pipeline/memory_estimate.h"
#include "quant/quantized_weight.h"

namespace diffuse::pipeline {
namespace {

int64_t element_bytes(torch::Dtype d) {
  return static_cast<int64_t>(c10::elementSize(d));
}

// Bytes per element of a linear weight held in `type`'s blocks (32 values per block).
double quantized_element_bytes(const std::string& type) {
  if (type == "q4_0") return 18.0 / 32.0;
  return 34.0 / 32.0;  // q8_0; int8 rows: 1 byte and a scale per row, about the same
}

// Whether a tensor of `dims` dimensions, `rows` rows and `numel` values named `name` is a layer
// weight --weights keeps in blocks: a matrix (or a convolution's) whose rows are whole blocks.
bool kept_in_blocks(const std::string& name, size_t dims, int64_t rows, int64_t numel) {
  return dims >= 2 && rows > 0 && (numel / rows) % 32 == 0 && io::ends_with(name, ".weight");
}

struct Census {
  int64_t bytes = 0, quantized = 0, largest_unit = 0, outside = 0, parameters = 0;
};

// What tensors weigh in `dtype` and, for the denoiser, under `type` (every linear and
// convolution weight whose rows are whole blocks) and as streamed block units
// ("<...>blocks.<n>." prefixes, as models/block_streaming.h streams them). Mapped files: only
// their headers are touched.
Census census_of(const std::map<std::string, torch::Tensor>& weights, torch::Dtype dtype,
                 const std::string& type, bool units) {
  Census c;
  static const std::regex unit_re(R"(^(.*blocks\.\d+)\.)");
  std::map<std::string, int64_t> unit_bytes;
  const double qe = quantized_element_bytes(type.empty() ? "q8_0" : type);
  for (const auto& [name, t] : weights) {
    const int64_t n = t.numel();
    c.parameters += n;
    const int64_t b =
        t.is_floating_point() ? n * element_bytes(dtype) : static_cast<int64_t>(t.nbytes());
    c.bytes += b;
    const bool blocks =
        kept_in_blocks(name, static_cast<size_t>(t.dim()), t.dim() > 0 ? t.size(0) : 0, n);
    c.quantized += blocks ? static_cast<int64_t>(static_cast<double>(n) * qe) : b;
    std::smatch m;
    if (units && std::regex_search(name, m, unit_re))
      unit_bytes[m[1]] += b;
    else
      c.outside += b;
  }
  for (const auto& [unit, b] : unit_bytes) c.largest_unit = std::max(c.largest_unit, b);
  return c;
}

Census census(const io::ModelFolder& folder, const std::string& component, torch::Dtype dtype,
              const std::string& type, bool units) {
  if (models::component_is_gguf(folder, component)) {
    // Already in blocks as stored: it loads (and is planned) as it is.
    Census c;
    c.bytes = c.quantized = c.parameters = models::component_weight_bytes(folder, component);
    return c;
  }
  return census_of(folder.component_weights(component), dtype, type, units);
}

// The widest hidden state of a text encoder's config (its MLP's), for the text stage's memory.
int64_t text_width(const io::JsonConfig& config) {
  const auto cfg = config.json();
  const auto& inner = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  int64_t widest = 0;
  for (const char* key : {"intermediate_size", "d_ff", "hidden_size", "d_model"})
    if (inner.contains(key) && inner[key].is_number_integer())
      widest = std::max(widest, inner[key].get<int64_t>());
  return widest;
}

// A prompt of up to 512 tokens, in float32: hidden states and the MLP's widest one, a few each.
int64_t text_activation_bytes(int64_t widest) {
  return 2 * 512 * widest * 4 * 4;
}

std::string text_label(const std::string& cls) {
  if (cls.rfind("CLIP", 0) == 0) return "CLIP";
  if (cls.rfind("T5", 0) == 0) return "T5";
  if (cls.rfind("Llama", 0) == 0) return "Llama";
  if (cls.rfind("Qwen2_5_VL", 0) == 0) return "Qwen2.5-VL";
  return cls.empty() ? "text encoder" : cls;
}

int64_t vae_factor(const io::JsonConfig& vae) {
  const auto j = vae.json();
  const auto& levels = j.contains("block_out_channels") ? j["block_out_channels"] : j["dim_mult"];
  const int64_t n = levels.is_array() ? static_cast<int64_t>(levels.size()) : 4;
  return int64_t{1} << std::max<int64_t>(0, n - 1);
}

int64_t latent_channels(const io::JsonConfig& vae) {
  return vae.get<int64_t>("latent_channels", vae.get<int64_t>("z_dim", 16));
}

// The channels of the VAE's full-resolution level (where its decoder's working set peaks).
int64_t vae_top_channels(const io::JsonConfig& vae) {
  const auto j = vae.json();
  if (j.contains("block_out_channels")) return j["block_out_channels"].front().get<int64_t>();
  // AutoencoderKLQwenImage: base_dim * dim_mult[0], with the upsampler's doubled input.
  return 2 * vae.get<int64_t>("base_dim", 96);
}

// What the user asked for, before any network is weighed.
PlanRequest request_from_flags(const FolderPlanOptions& o) {
  PlanRequest r;
  r.weight_type = o.weight_type == "none" ? "" : o.weight_type;
  if (!r.weight_type.empty()) quant::parse_weight_type(r.weight_type, "--weights");
  r.keep_text_encoders = o.keep_text_encoders;
  r.denoiser_dtype = device::dtype_name(o.dtype);
  return r;
}

}  // namespace

std::string plan_family(const io::ModelFolder& folder) {
  const std::string cls = folder.model_index().get<std::string>("_class_name", "");
  if (cls.find("HiDream") != std::string::npos) return "hidream";
  if (cls.find("Flux") != std::string::npos) return "flux";
  if (cls.find("QwenImage") != std::string::npos) return "qwen-image";
  if (cls.find("StableDiffusionXL") != std::string::npos) return "stable-diffusion-xl";
  if (cls.find("StableDiffusion") != std::string::npos) return "stable-diffusion";
  throw ConfigError(folder.dir() + "/model_index.json: _class_name '" + cls +
                    "' is no family diffuse plans for (Stable Diffusion 1.x/2.x/XL, FLUX, "
                    "HiDream, Qwen-Image)");
}

int64_t default_plan_side(const io::ModelFolder& folder) {
  if (plan_family(folder).rfind("stable-diffusion", 0) != 0) return 1024;
  const auto unet = folder.component_config("unet");
  const auto vae = folder.component_config("vae");
  return unet.get<int64_t>("sample_size", 64) * vae_factor(vae);
}

int64_t plan_budget(const torch::Device& device, int64_t max_memory) {
  if (max_memory > 0) return max_memory;
  const int64_t available = device::available_bytes(device);
  if (available <= 0) return 0;
  // What the plan does not count (the allocator's slack and fragments, the program itself,
  // the OS's own needs) takes some of it: 5 % and at least 512 MiB.
  const int64_t reserve = std::max<int64_t>(available / 20, int64_t{512} << 20);
  return std::max<int64_t>(available - reserve, 1);
}

int64_t loaded_bytes(const std::map<std::string, torch::Tensor>& weights, torch::Dtype dtype) {
  return census_of(weights, dtype, "", false).bytes;
}

PlanRequest plan_request(const io::ModelFolder& folder, const FolderPlanOptions& o) {
  const std::string family = plan_family(folder);
  // Stable Diffusion's networks as its pipeline reads them, from a folder or a single file.
  if (family.rfind("stable-diffusion", 0) == 0)
    return plan_request(open_model_source(folder.dir(), {}), o);
  PlanRequest r = request_from_flags(o);
  // Text encoders, in the order the pipelines run them.
  int64_t widest_text = 0;
  for (const char* component :
       {"text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"}) {
    if (!folder.has_component(component)) continue;
    NetworkWeights n;
    n.component = component;
    n.label = text_label(folder.component_class(component));
    n.bytes = census(folder, component, o.text_dtype.value_or(o.dtype), "", false).bytes;
    r.text_encoders.push_back(n);
    widest_text = std::max(widest_text, text_width(folder.component_config(component)));
  }
  r.text_activations = text_activation_bytes(widest_text);

  const std::string& denoiser = o.transformer_component;
  if (!folder.has_component(denoiser))
    throw IoError("model folder '" + folder.dir() + "' has no " + denoiser + "/");
  const auto dc = census(folder, denoiser, o.dtype, r.weight_type, /*units=*/true);
  r.denoiser = {denoiser,   "transformer", dc.bytes,     dc.largest_unit,
                dc.outside, dc.quantized,  dc.parameters};
  if (models::component_is_gguf(folder, denoiser)) {
    // Loaded whole in the file's own block types: nothing to choose.
    r.denoiser.quantized_bytes = 0;
    r.denoiser.largest_unit = 0;
    r.weight_type.clear();
    r.denoiser_dtype = "GGUF";
  }
  r.vae = {"vae", "VAE", census(folder, "vae", o.vae_dtype, "", false).bytes, 0, 0, 0};
  // Only HiDream's pipeline loads its encoders one by one (four, two of them large).
  r.text_one_at_a_time_possible = o.text_one_at_a_time_possible && family == "hidream";
  set_plan_stages(r, family, folder.component_config(denoiser), folder.component_config("vae"), o);
  if (r.denoiser_dtype == "GGUF") r.streaming = "off";
  return r;
}

PlanRequest plan_request(const ModelSource& src, const FolderPlanOptions& o) {
  PlanRequest r = request_from_flags(o);
  int64_t widest_text = 0;
  for (const auto& t : src.text_encoders) {
    NetworkWeights n;
    n.component = t.component;
    n.label = "CLIP";
    n.bytes = census_of(t.weights, o.text_dtype.value_or(o.dtype), "", false).bytes;
    r.text_encoders.push_back(n);
    widest_text = std::max(widest_text, text_width(t.config));
  }
  r.text_activations = text_activation_bytes(widest_text);
  // The UNet has no blocks to stream.
  r.denoiser.component = "unet";
  r.denoiser.label = "UNet";
  if (src.unet_file && io::is_gguf_file(src.unet_file->path)) {
    // The UNet's tensors as stored; --weights quantizes the plain weights whose rows are whole
    // blocks (a GGUF's convolutions are stored plain: ggml blocks run along a tensor's last
    // dimension), as the loader does.
    const auto gguf = io::GgufFile::open(src.unet_file->path);
    const double qe = quantized_element_bytes(r.weight_type.empty() ? "q8_0" : r.weight_type);
    int64_t bytes = 0, quantized = 0;
    for (const auto& name : gguf->names()) {
      if (!io::starts_with(name, src.unet_file->prefix)) continue;
      const auto& info = gguf->info(name);
      const auto stored = static_cast<int64_t>(info.bytes);
      int64_t n = 1;
      for (const auto d : info.shape) n *= static_cast<int64_t>(d);
      const bool blocks =
          !quant::ggml_type_traits(info.type).quantized &&
          kept_in_blocks(name, info.shape.size(), info.shape.empty() ? 0 : info.shape[0], n);
      bytes += stored;
      quantized += blocks ? static_cast<int64_t>(static_cast<double>(n) * qe) : stored;
    }
    r.denoiser.bytes = bytes;
    r.denoiser.quantized_bytes = r.weight_type.empty() ? bytes : quantized;
    r.denoiser.parameters = src.unet_file->parameters;
    if (r.weight_type.empty()) r.denoiser_dtype = "GGUF";
  } else if (src.unet_file) {
    const int64_t n = src.unet_file->parameters;
    r.denoiser.bytes = n * element_bytes(o.dtype);
    r.denoiser.quantized_bytes =
        static_cast<int64_t>(static_cast<double>(n) * quantized_element_bytes(r.weight_type));
    r.denoiser.parameters = n;
  } else {
    const auto dc = census_of(src.unet_weights, o.dtype, r.weight_type, false);
    r.denoiser.bytes = dc.bytes;
    r.denoiser.quantized_bytes = dc.quantized;
    r.denoiser.parameters = dc.parameters;
  }
  // Stable Diffusion keeps the VAE's layers in blocks too under --weights.
  const auto vae = census_of(src.vae_weights, o.vae_dtype, r.weight_type, false);
  r.vae = {"vae", "VAE", r.weight_type.empty() ? vae.bytes : vae.quantized, 0, 0, 0};
  r.text_one_at_a_time_possible = false;
  set_plan_stages(r, "stable-diffusion", src.unet_config, src.vae_config, o);
  return r;
}

void set_plan_stages(PlanRequest& r, const std::string& family, const io::JsonConfig& dcfg,
                     const io::JsonConfig& vcfg, const FolderPlanOptions& o) {
  const bool sd = family.rfind("stable-diffusion", 0) == 0;
  const int64_t f = vae_factor(vcfg);
  const int64_t side = sd ? dcfg.get<int64_t>("sample_size", 64) * f : 1024;
  const int64_t width = o.width > 0 ? o.width : side, height = o.height > 0 ? o.height : side;
  r.device = device::device_name(o.device);
  r.budget = plan_budget(o.device, o.max_memory);
  r.budget_given = o.max_memory > 0;
  r.size = (o.images > 1 ? std::to_string(o.images) + " images at " : std::string()) +
           std::to_string(width) + "x" + std::to_string(height);
  r.streaming = o.streaming;
  // Stable Diffusion's pipeline frees each network after its stage in a single generation and
  // keeps them all otherwise (a batch, the server); the DiT pipelines follow the plan.
  if (sd)
    r.residency = o.keep_text_encoders ? PlanRequest::Residency::kAllResident
                                       : PlanRequest::Residency::kPerStage;

  const int64_t lh = height / f, lw = width / f;
  const int64_t e = element_bytes(o.dtype);
  if (sd) {
    // Classifier-free guidance doubles the UNet's batch. Its top level holds input, hidden
    // states, skips and the attention's projections: about ten maps of its width at once.
    const auto& blocks = dcfg.json()["block_out_channels"];
    const int64_t c0 = blocks.is_array() && !blocks.empty() ? blocks.front().get<int64_t>() : 320;
    r.step_activations = activation_bytes(2 * o.images, c0, lh, lw, e, 10);
  } else {
    const int64_t p = dcfg.get<int64_t>("patch_size", 1);
    const int64_t packed = std::max<int64_t>(
        1, dcfg.get<int64_t>("in_channels", 16) / (latent_channels(vcfg) * p * p));
    const int64_t tokens =
        (lh / p) * (lw / p) / packed * (1 + o.reference_images) + 512 /* text tokens */;
    const int64_t inner =
        dcfg.get<int64_t>("num_attention_heads", 24) * dcfg.get<int64_t>("attention_head_dim", 128);
    // HiDream batches classifier-free guidance; FLUX is distilled and Qwen-Image runs its two
    // calls one after the other. Per token: q, k, v, attention out, the residual stream and the
    // MLP's 4x hidden state before and after its activation: about 16 widths.
    const int64_t batch = (family == "hidream" ? 2 : 1) * o.images;
    r.step_activations = activation_bytes(batch, tokens, inner, 1, e, 16);
  }
  // The decoder's full-resolution level: input, hidden and residual (vae_working_bytes) and
  // the normalisation's and convolution's temporaries: about six maps.
  const int64_t top = vae_top_channels(vcfg);
  const int64_t ve = element_bytes(o.vae_dtype);
  r.vae_activations = activation_bytes(o.images, top, height, width, ve, 6);
  const int64_t tile = std::min<int64_t>({512, height, width});
  r.vae_tiled_activations =
      std::max(height, width) > tile && vcfg.json().contains("block_out_channels")
          ? activation_bytes(o.images, top, tile, tile, ve, 6)
          : 0;
  r.vae_tiling = o.vae_tiling;
  // Stages on other devices are not this device's memory.
  if (o.text_device && *o.text_device != o.device) r.text_encoders.clear();
  if (o.vae_device && *o.vae_device != o.device)
    r.vae = {}, r.vae_activations = r.vae_tiled_activations = 0;
  // The pipelines tile above 1024x1024 pixels whatever the memory (vae_tiling_policy.h).
  if (o.vae_tiling == "auto" && r.vae_tiled_activations > 0 && width * height > 1024 * 1024)
    r.vae_tiling = "on";
}

FolderPlanOptions pipeline_plan_options(torch::Device device, torch::Dtype dtype,
                                        const std::string& transformer_component,
                                        const std::string& streaming,
                                        const std::optional<quant::GgmlType>& weight_type,
                                        bool keep_text_encoders, int64_t max_memory) {
  FolderPlanOptions o;
  o.device = device;
  o.dtype = dtype;
  o.transformer_component = transformer_component;
  o.streaming = streaming;
  o.weight_type = weight_type ? quant::weight_type_name(*weight_type) : "";
  o.keep_text_encoders = keep_text_encoders;
  o.max_memory = max_memory;
  return o;
}

MemoryPlan plan_generation(const io::ModelFolder& folder, FolderPlanOptions o, int64_t width,
                           int64_t height, int64_t reference_images,
                           const VaeTilingOptions& vae_tiling, StageTimings* timings) {
  o.width = width;
  o.height = height;
  o.reference_images = reference_images;
  o.vae_tiling = vae_tiling.mode;
  auto plan = plan_folder(folder, o);
  if (!plan.fits) throw InvalidArgument(plan.advice);
  if (timings) timings->plan = plan.line;
  return plan;
}

MemoryPlan plan_folder(const io::ModelFolder& folder, const FolderPlanOptions& options) {
  return plan_memory(plan_request(folder, options));
}

}  // namespace diffuse::pipeline
