#include "pipeline/real_size_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"
#include "models/autoencoder_kl.h"
#include "models/builtin_configs.h"
#include "models/clip_text_model.h"
#include "models/flux_transformer.h"
#include "models/hidream_transformer.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "pipeline/component_writer.h"
#include "pipeline/memory_plan.h"
#include "pipeline/prompt_corpus.h"
#include "quant/ggml_blocks.h"
#include "quant/quantize_model.h"
#include "text/bpe_trainer.h"
#include "text/llama_bpe_trainer.h"
#include "text/t5_tokenizer_trainer.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace diffuse::pipeline {
namespace {

constexpr int64_t kUnitBytes = int64_t{256} << 20;  // a unit is at most this, or a leaf

json flow_scheduler(double shift, bool dynamic) {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"base_image_seq_len", 256},
          {"base_shift", 0.5},
          {"max_image_seq_len", 4096},
          {"max_shift", 1.15},
          {"num_train_timesteps", 1000},
          {"shift", shift},
          {"use_dynamic_shifting", dynamic}};
}

// HiDream-I1-Full's scheduler: UniPC on flow sigmas.
json hidream_scheduler() {
  return {{"_class_name", "UniPCMultistepScheduler"},
          {"beta_end", 0.02},
          {"beta_schedule", "linear"},
          {"beta_start", 0.0001},
          {"flow_shift", 3.0},
          {"num_train_timesteps", 1000},
          {"prediction_type", "flow_prediction"},
          {"solver_order", 2},
          {"solver_type", "bh2"},
          {"timestep_spacing", "linspace"},
          {"use_flow_sigmas", true},
          {"final_sigmas_type", "zero"}};
}

json clip_with_positions(json config, const char* architecture, int64_t positions) {
  config["architectures"] = {architecture};
  config["max_position_embeddings"] = positions;
  return config;
}

// A unit: a module written whole, or only its own (direct) parameters when its children are
// units of their own.
struct Unit {
  std::string prefix;
  torch::nn::Module* module = nullptr;
  bool own_only = false;
};

int64_t parameter_bytes(torch::nn::Module& m, bool recurse) {
  int64_t b = 0;
  for (const auto& p : m.parameters(recurse)) b += p.numel() * 2;
  return b;
}

void collect_units(torch::nn::Module& m, const std::string& prefix, int64_t limit,
                   std::vector<Unit>& out) {
  if (m.children().empty() || parameter_bytes(m, true) <= limit) {
    out.push_back({prefix, &m, false});
    return;
  }
  if (!m.parameters(false).empty()) out.push_back({prefix, &m, true});
  for (const auto& c : m.named_children())
    collect_units(*c.value(), prefix + c.key() + ".", limit, out);
}

std::vector<std::pair<std::string, torch::Tensor>> unit_parameters(const Unit& u) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : u.module->named_parameters(!u.own_only))
    out.emplace_back(u.prefix + p.key(), p.value());
  return out;
}

// Seeded values for the unit's parameters (norm scales 1 and other parameters 0 where the random
// initialisation does not reach, instead of uninitialised memory).
void fill_unit(const Unit& u, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : unit_parameters(u)) {
    if (p.dim() == 1 && io::ends_with(name, "weight"))
      p.fill_(1.0);
    else
      p.zero_();
  }
  if (!u.own_only) nn::init_pooled_random_weights(*u.module, seed);
}

void free_unit(const Unit& u) {
  for (auto& [name, p] : unit_parameters(u)) p.set_data(torch::empty({0}, p.options()));
}

// The one unit whose values exist while a file is written: unit k gets seed + k, so every
// format and shard size gives the same values.
struct UnitCursor {
  std::vector<Unit>& units;
  uint64_t seed;
  int64_t current = -1;

  // Unit k's parameter `name` (filling unit k and freeing the one before, if it is another).
  torch::Tensor parameter(size_t k, const std::string& name) {
    if (current != static_cast<int64_t>(k)) {
      release();
      fill_unit(units[k], seed + k);
      current = static_cast<int64_t>(k);
    }
    for (const auto& [n, p] : unit_parameters(units[k]))
      if (n == name) return p;
    throw InvalidArgument("random writer: no parameter '" + name + "'");
  }
  void release() {
    if (current >= 0) free_unit(units[static_cast<size_t>(current)]);
    current = -1;
  }
};

// A network built under SkipInitGuard: its parameters take no memory until filled.
struct Network {
  std::shared_ptr<torch::nn::Module> module;
  std::string base;  // "model" (transformers) or "diffusion_pytorch_model" (diffusers)
};

Network build(const std::string& kind, const json& config, const std::string& what,
              torch::Dtype dtype) {
  const io::JsonConfig cfg(config, what);
  nn::SkipInitGuard skip(dtype);
  if (kind == "clip") {
    auto c = models::ClipTextConfig::from_json(cfg);
    const auto& arch = config.value("architectures", json::array());
    c.with_projection = !arch.empty() && arch[0] == "CLIPTextModelWithProjection";
    return {models::ClipTextModel(c).ptr(), "model"};
  }
  if (kind == "t5")
    return {models::T5EncoderModel(models::T5Config::from_json(cfg)).ptr(), "model"};
  if (kind == "llama")
    return {models::LlamaForCausalLM(models::LlamaConfig::from_json(cfg)).ptr(), "model"};
  if (kind == "unet")
    return {models::UNet2DConditionModel(models::UNet2DConditionConfig::from_json(cfg)).ptr(),
            "diffusion_pytorch_model"};
  if (kind == "flux")
    return {models::FluxTransformer2DModel(models::FluxTransformerConfig::from_json(cfg)).ptr(),
            "diffusion_pytorch_model"};
  if (kind == "hidream")
    return {models::HiDreamImageTransformer2DModel(models::HiDreamTransformerConfig::from_json(cfg))
                .ptr(),
            "diffusion_pytorch_model"};
  if (kind == "vae")
    return {models::AutoencoderKL(models::AutoencoderKLConfig::from_json(cfg)).ptr(),
            "diffusion_pytorch_model"};
  throw InvalidArgument("no random writer for a '" + kind + "' network (" + what + ")");
}

struct Writer {
  fs::path root;
  torch::Dtype dtype;
  int64_t shard_bytes;
  const RandomFolderOptions& o;
  RandomFolderReport report;

  void log(const std::string& s) const {
    if (o.log) o.log(s);
  }

  // `net` into root/component as safetensors: one file, or shards with their index. A unit is
  // filled when its first tensor is written and freed when the next unit's is: writing holds one
  // unit, whatever the shard size.
  void safetensors(const std::string& component, const Network& net, uint64_t seed) {
    std::vector<Unit> units;
    collect_units(*net.module, "", std::min(kUnitBytes, shard_bytes), units);
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    UnitCursor cursor{units, seed};
    // Shards of whole units, each closed once it reaches shard_bytes.
    std::vector<std::vector<io::SafetensorsTensorToWrite>> shards(1);
    std::vector<int64_t> shard_sizes(1, 0);
    for (size_t k = 0; k < units.size(); ++k) {
      if (shard_sizes.back() >= shard_bytes) shards.emplace_back(), shard_sizes.push_back(0);
      for (const auto& [name, p] : unit_parameters(units[k])) {
        shards.back().push_back({name, dtype, p.sizes().vec(), [&cursor, this, k, name = name] {
                                   return cursor.parameter(k, name).to(dtype);
                                 }});
        shard_sizes.back() += p.numel() * element;
      }
    }
    const fs::path dir = root / component;
    fs::create_directories(dir);
    json weight_map = json::object();
    int64_t written = 0;
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string name = net.base + ".safetensors";
      if (shards.size() > 1) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "%s-%05zu-of-%05zu.safetensors", net.base.c_str(), i + 1,
                      shards.size());
        name = buf;
      }
      for (const auto& t : shards[i]) weight_map[t.name] = name;
      io::save_safetensors_streamed((dir / name).string(), shards[i],
                                    {{"format", "pt"}, {"made_by", "diffuse create-demo-model"}});
      written += shard_sizes[i];
    }
    cursor.release();
    if (shards.size() > 1)
      write_json_file(dir / (net.base + ".safetensors.index.json"),
                      nlohmann::ordered_json{{"metadata", {{"total_size", written}}},
                                             {"weight_map", weight_map}});
    report.components.emplace_back(component, written);
    report.bytes += written;
    log("  " + component + ": " + format_memory(written));
  }

  // `net` into root/component/<base>.gguf, its matrices in `type`'s blocks, each unit filled
  // when its first tensor is written and freed when the next unit's is.
  void gguf(const std::string& component, const Network& net, uint64_t seed, quant::GgmlType type) {
    std::vector<Unit> units;
    // The safetensors writer's units: the same seed gives the same values in both formats.
    collect_units(*net.module, "", std::min(kUnitBytes, shard_bytes), units);
    UnitCursor cursor{units, seed};
    std::vector<io::GgufTensorToWrite> tensors;
    for (size_t k = 0; k < units.size(); ++k) {
      for (const auto& [name, p] : unit_parameters(units[k])) {
        io::GgufTensorToWrite t;
        t.name = name;
        t.shape = p.sizes().vec();
        t.type = quant::gguf_storage_type(dtype, true, t.shape, type);
        // Looked up again at write time: p itself is replaced when the unit is freed.
        t.produce = [&cursor, this, k, name = name] { return cursor.parameter(k, name).to(dtype); };
        tensors.push_back(std::move(t));
      }
    }
    fs::create_directories(root / component);
    const fs::path path = root / component / (net.base + ".gguf");
    torch::NoGradGuard no_grad;
    io::write_gguf(path.string(),
                   {{"general.architecture", component},
                    {"general.name", "diffuse create-demo-model (random weights)"},
                    {"diffuse.type", quant::ggml_type_traits(type).name}},
                   tensors);
    cursor.release();
    const auto bytes = static_cast<int64_t>(fs::file_size(path));
    report.components.emplace_back(component, bytes);
    report.bytes += bytes;
    log("  " + component + ": " + format_memory(bytes) + " (" + quant::ggml_type_traits(type).name +
        ")");
  }
};

// Bytes the folder will take: parameters at `element` bytes, the quantized transformer at about
// 34/32 bytes per element of its matrices.
int64_t estimate_bytes(const std::vector<Network>& nets, int64_t element, bool quantized_last) {
  int64_t total = 0;
  for (size_t i = 0; i < nets.size(); ++i) {
    const bool q = quantized_last && i + 1 == nets.size();
    for (const auto& p : nets[i].module->parameters(true))
      total += q && p.dim() >= 2 ? p.numel() * 34 / 32 : p.numel() * element;
  }
  return total;
}

torch::Dtype storage_dtype(const std::string& weights) {
  if (weights != "bf16" && weights != "fp16" && weights != "q8_0")
    throw InvalidArgument("create-demo-model --weights '" + weights +
                          "': expected bf16, fp16 or q8_0");
  return weights == "fp16" ? torch::kFloat16 : torch::kBFloat16;
}

}  // namespace

int64_t write_random_component(const std::string& root, const std::string& component,
                               const std::string& kind, const nlohmann::json& config,
                               const RandomFolderOptions& o) {
  const std::string weights = o.weights.empty() ? "bf16" : o.weights;
  const torch::Dtype dtype = storage_dtype(weights);
  if (o.shard_bytes < 1)
    throw InvalidArgument("create-demo-model: the shard size must be positive");
  auto net = build(kind, config, component, dtype);
  write_json_file(fs::path(root) / component / "config.json", config);
  Writer w{root, dtype, o.shard_bytes, o, {}};
  if (weights == "q8_0")
    w.gguf(component, net, o.seed, quant::GgmlType::Q8_0);
  else
    w.safetensors(component, net, o.seed);
  return w.report.bytes;
}

std::vector<std::string> real_size_archs() {
  auto names = models::builtin_arch_names();  // the Stable Diffusion UNets
  for (const char* dit : {"flux-dev", "flux-schnell", "flux-kontext", "hidream-i1", "hidream-e1"})
    names.emplace_back(dit);
  return names;
}

bool is_real_size_arch(const std::string& arch) {
  for (const auto& a : real_size_archs())
    if (a == arch) return true;
  return false;
}

namespace {

// Stable Diffusion 1.x/2.x and SDXL as their repositories lay them out (the fp16 variants).
RandomFolderSpec stable_diffusion_spec(const std::string& arch) {
  const models::ArchConfigs& a = models::builtin_arch(arch);
  RandomFolderSpec s;
  s.arch = arch;
  s.family = "unet";
  s.denoiser = a.unet;
  s.vae = a.vae;
  s.scheduler = a.scheduler;
  s.default_weights = "fp16";
  const auto clip = [](const json& config, const char* component, const char* tokenizer) {
    return RandomTextEncoderSpec{component, tokenizer, "clip", config,
                                 config.value("max_position_embeddings", int64_t{77})};
  };
  s.text_encoders = {clip(a.text_encoder, "text_encoder", "tokenizer")};
  if (a.text_encoder_2.is_null()) {
    s.pipeline_class = "StableDiffusionPipeline";
    s.index_extras = {{"safety_checker", {nullptr, nullptr}},
                      {"feature_extractor", {nullptr, nullptr}},
                      {"requires_safety_checker", false}};
  } else {
    s.pipeline_class = "StableDiffusionXLPipeline";
    s.text_encoders.push_back(clip(a.text_encoder_2, "text_encoder_2", "tokenizer_2"));
    s.index_extras = {{"force_zeros_for_empty_prompt", true}};
  }
  return s;
}

}  // namespace

RandomFolderSpec real_size_spec(const std::string& arch) {
  RandomFolderSpec s;
  s.arch = arch;
  s.vae = models::flux_vae_config();
  if (arch == "flux-dev" || arch == "flux-schnell" || arch == "flux-kontext") {
    const bool schnell = arch == "flux-schnell";
    s.family = "flux";
    s.pipeline_class = arch == "flux-kontext" ? "FluxKontextPipeline" : "FluxPipeline";
    s.denoiser = models::flux_transformer_config(!schnell);
    s.scheduler = schnell ? flow_scheduler(1.0, false) : flow_scheduler(3.0, true);
    s.text_encoders = {{"text_encoder", "tokenizer", "clip",
                        clip_with_positions(models::clip_l_text_config(), "CLIPTextModel", 77), 77},
                       {"text_encoder_2", "tokenizer_2", "t5", models::t5_xxl_encoder_config(),
                        schnell ? 256 : 512}};
    return s;
  }
  if (arch == "hidream-i1" || arch == "hidream-e1") {
    s.family = "hidream";
    s.pipeline_class =
        arch == "hidream-e1" ? "HiDreamImageEditingPipeline" : "HiDreamImagePipeline";
    s.denoiser = models::hidream_i1_transformer_config();
    s.scheduler = hidream_scheduler();
    // Long-CLIP positions (248) on both CLIPs, each with its projection.
    s.text_encoders = {
        {"text_encoder", "tokenizer", "clip",
         clip_with_positions(models::clip_l_text_config(), "CLIPTextModelWithProjection", 248),
         248},
        {"text_encoder_2", "tokenizer_2", "clip",
         clip_with_positions(models::clip_g_text_config(), "CLIPTextModelWithProjection", 248),
         248},
        {"text_encoder_3", "tokenizer_3", "t5", models::t5_xxl_encoder_config(), 128},
        {"text_encoder_4", "tokenizer_4", "llama", models::llama31_8b_config(), 128}};
    return s;
  }
  for (const auto& sd : models::builtin_arch_names())
    if (arch == sd) return stable_diffusion_spec(arch);
  std::string names;
  for (const auto& a : real_size_archs()) names += (names.empty() ? "" : ", ") + a;
  throw InvalidArgument("no architecture '" + arch + "' (expected one of " + names + ")");
}

RandomFolderReport write_random_folder(const std::string& dir, const RandomFolderSpec& spec,
                                       const RandomFolderOptions& options) {
  RandomFolderOptions o = options;
  if (o.weights.empty()) o.weights = spec.default_weights;
  const torch::Dtype dtype = storage_dtype(o.weights);
  if (o.shard_bytes < 1)
    throw InvalidArgument("create-demo-model: the shard size must be positive");
  const fs::path target = fs::absolute(fs::path(dir));
  std::error_code ec;
  if (fs::exists(target) && !(fs::is_directory(target) && fs::is_empty(target, ec)))
    throw InvalidArgument("create-demo-model: '" + dir +
                          "' exists and is not an empty folder; remove it or name another");

  // Every network built (no memory yet) to size the folder before anything is written.
  std::vector<Network> nets;
  for (const auto& t : spec.text_encoders)
    nets.push_back(build(t.kind, t.config, spec.arch + " " + t.component, dtype));
  nets.push_back(build("vae", spec.vae, spec.arch + " vae", dtype));
  const std::string denoiser = spec.denoiser_component();
  nets.push_back(build(spec.family, spec.denoiser, spec.arch + " " + denoiser, dtype));
  const int64_t need =
      estimate_bytes(nets, static_cast<int64_t>(c10::elementSize(dtype)), o.weights == "q8_0");
  const fs::path parent = target.parent_path();
  fs::create_directories(parent);
  const auto free_bytes = static_cast<int64_t>(fs::space(parent).available);
  if (free_bytes < need + (int64_t{1} << 30))
    throw InvalidArgument("create-demo-model --arch " + spec.arch + " --weights " + o.weights +
                          ": the folder needs about " + format_memory(need) +
                          " (+1 GiB headroom), the disk under '" + parent.string() + "' has " +
                          format_memory(free_bytes) + " free" +
                          (o.weights == "q8_0" ? "" : " (--weights q8_0 needs less)"));

  // Written beside the target and renamed when complete.
  const fs::path partial = parent / (target.filename().string() + ".partial");
  fs::remove_all(partial, ec);
  fs::create_directories(partial);
  Writer w{partial, dtype, o.shard_bytes, o, {}};
  w.log("writing a random " + spec.arch + " folder (" + o.weights + ", about " +
        format_memory(need) + ") to " + target.string());
  try {
    const auto& corpus = demo_prompt_corpus();
    nlohmann::ordered_json index = {
        {"_class_name", spec.pipeline_class},
        {"_diffusers_version", "0.34.0"},
        {"_diffuse_note", "random weights made by `diffuse create-demo-model --arch " + spec.arch +
                              "`; for measuring, not a trained model"}};
    uint64_t seed = o.seed;
    for (size_t i = 0; i < spec.text_encoders.size(); ++i) {
      const auto& t = spec.text_encoders[i];
      json config = t.config;
      const std::string tok_dir = (partial / t.tokenizer).string();
      // The learned vocabulary fits the embedding table (the real ones are far larger).
      const auto rows = static_cast<int>(config.value(
          "vocab_size", config.value("text_config", json::object()).value("vocab_size", 0)));
      if (t.kind == "clip") {
        const auto vocab = text::train_clip_bpe(corpus, std::max(0, std::min(1000, rows - 514)));
        text::save_clip_tokenizer(vocab, tok_dir, static_cast<int>(t.max_length));
        const auto n = static_cast<int64_t>(vocab.tokens.size());
        config["bos_token_id"] = n - 2;
        config["eos_token_id"] = n - 1;
        config["pad_token_id"] = n - 1;
        index[t.component] = {"transformers", config["architectures"][0]};
        index[t.tokenizer] = {"transformers", "CLIPTokenizer"};
      } else if (t.kind == "t5") {
        text::train_t5_tokenizer(corpus, std::min(400, rows), tok_dir, t.max_length);
        index[t.component] = {"transformers", "T5EncoderModel"};
        index[t.tokenizer] = {"transformers", "T5Tokenizer"};
      } else {
        text::train_llama_tokenizer(corpus, std::max(0, std::min(400, rows - 258)), tok_dir,
                                    t.max_length);
        const auto tok = text::load_tokenizer(tok_dir);
        config["bos_token_id"] = tok->bos_id();
        config["eos_token_id"] = tok->eos_id();
        index[t.component] = {"transformers", "LlamaForCausalLM"};
        index[t.tokenizer] = {"transformers", "PreTrainedTokenizerFast"};
      }
      write_json_file(partial / t.component / "config.json", config);
      w.safetensors(t.component, nets[i], seed);
      seed += 1000;
      nets[i].module.reset();
    }
    const size_t vae_i = spec.text_encoders.size();
    write_json_file(partial / "vae" / "config.json", spec.vae);
    w.safetensors("vae", nets[vae_i], seed);
    seed += 1000;
    index["vae"] = {"diffusers", "AutoencoderKL"};
    write_json_file(partial / denoiser / "config.json", spec.denoiser);
    if (o.weights == "q8_0")
      w.gguf(denoiser, nets[vae_i + 1], seed, quant::GgmlType::Q8_0);
    else
      w.safetensors(denoiser, nets[vae_i + 1], seed);
    index[denoiser] = {"diffusers", spec.family == "unet"   ? "UNet2DConditionModel"
                                    : spec.family == "flux" ? "FluxTransformer2DModel"
                                                            : "HiDreamImageTransformer2DModel"};
    write_json_file(partial / "scheduler" / "scheduler_config.json", spec.scheduler);
    index["scheduler"] = {"diffusers", spec.scheduler.value("_class_name", std::string())};
    for (const auto& [key, value] : spec.index_extras.items()) index[key] = value;
    write_json_file(partial / "model_index.json", index);
    if (fs::exists(target)) fs::remove(target);  // the empty folder
    fs::rename(partial, target);
  } catch (...) {
    fs::remove_all(partial, ec);
    throw;
  }
  return w.report;
}

}  // namespace diffuse::pipeline
