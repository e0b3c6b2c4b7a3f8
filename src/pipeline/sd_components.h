// The loaded state of a Stable Diffusion (1.x/2.x, SDXL) pipeline: devices and dtypes, its
// networks (built and loaded on first use, freed after their stage with offload), the text
// encoders with their tokenizers, LoRA bindings and the device graph of the UNet call. Private
// to the pipeline's files (stable_diffusion.cpp, sd_prompt_encoding.cpp).
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "accel/token_merging_payoff.h"
#include "accel/unet_graph.h"
#include "device/memory.h"
#include "io/json_config.h"
#include "io/lora_key_map.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/controlnet.h"
#include "models/load_component.h"
#include "models/unet2d_condition.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/load_weights.h"
#include "pipeline/lora_set.h"
#include "pipeline/memory_plan.h"
#include "pipeline/model_source.h"
#include "pipeline/sdxl_conditioning.h"
#include "pipeline/stable_diffusion.h"
#include "quant/quantized_weight.h"
#include "text/clip_tokenizer.h"

namespace diffuse::pipeline {

struct StableDiffusion::Components {
  torch::Device device{torch::kCPU};  // the UNet's; the denoising loop runs here
  torch::Device text_device{torch::kCPU};
  torch::Device vae_device{torch::kCPU};
  torch::Dtype unet_dtype = torch::kFloat32, text_dtype = torch::kFloat32,
               vae_dtype = torch::kFloat32;
  ModelSource source;  // weights (file mappings) stay here only with offload
  bool offload = false;
  int64_t max_memory = 0;  // LoadOptions::max_memory
  // The memory plan's networks, weighed at load from the source's weight headers (which a
  // resident load drops); each generation plans its stages with it.
  PlanRequest plan_networks;
  int64_t resident_on_device = 0;  // bytes of the networks loaded and kept on `device`
  accel::UNetGraph unet_graph;     // GenerationConfig::cuda_graph's recording, across generations
  bool keep_16bit_weights = true;  // LoadOptions::keep_16bit_weights
  bool pack_conv_weights = true;   // LoadOptions::pack_conv_weights, never with offload
  std::optional<quant::GgmlType> weight_type;  // LoadOptions::weights: UNet and VAE
  // The CLIP text encoders, as ModelSource::text_encoders lists them.
  struct TextEncoder {
    std::string component;
    std::unique_ptr<text::ClipTokenizer> tokenizer;
    models::ClipTextConfig config;
    models::ClipTextModel module{nullptr};
  };
  std::vector<TextEncoder> text_encoders;
  // The UNet takes SDXL's added conditioning: prompts are encoded from the penultimate layer
  // of every encoder, and the last encoder's projected output is the pooled embedding.
  bool sdxl = false;
  SdxlOptions sdxl_options;
  models::UNet2DConditionConfig unet_config;
  models::AutoencoderKLConfig vae_config;
  models::UNet2DConditionModel unet_module{nullptr};
  models::AutoencoderKL vae_module{nullptr};
  int64_t unet_parameters = 0;  // for the estimate of a step's work (its CPU threads)
  // Token merging's measured payoff per run shape (batch, latent size, ratio, sites).
  std::map<std::string, accel::TokenMergingPayoff> tome_payoffs;
  io::JsonConfig scheduler_config;
  // GenerationConfig::controlnets' networks by folder, loaded at their first use.
  std::map<std::string, models::ControlNetModel> controlnets;

  // Each network is built without LibTorch's random initialisation, in its final dtype, and
  // then receives its weights (load_state_dict fails on any parameter left out).
  template <typename M, typename Config>
  M& loaded(M& slot, const Config& config, const std::map<std::string, torch::Tensor>& weights,
            const char* component, const torch::Device& where, torch::Dtype dtype,
            const std::set<std::string>& ignored = {}) {
    if (slot) return slot;
    // --weights: the UNet's and the VAE's layers kept in blocks (a batch or the server keeps
    // the VAE beside the UNet); the text encoders stay plain.
    const bool quantize =
        weight_type && (std::string(component) == "unet" || std::string(component) == "vae");
    {
      nn::SkipInitGuard skip_init(dtype, quantize ? nn::SkipInitGuard::Weights::kDeferred
                                                  : nn::SkipInitGuard::Weights::kUninitialised);
      slot = M(config);
    }
    const std::string where_from = source.path + " (" + component + ")";
    std::set<std::string> skip = ignored;
    std::map<std::string, torch::Tensor> rest;  // the weights not kept quantized
    if (quantize) {  // layer by layer from the file: the plain UNet never exists
      const auto kept =
          models::quantize_layers_from_weights(*slot, weights, *weight_type, where, where_from);
      for (const auto& [name, t] : weights)
        if (!kept.count(name)) rest.emplace(name, t);
      skip.insert(kept.begin(), kept.end());
    }
    std::set<std::string> keep_16bit;
    if (keep_16bit_weights && where.is_cpu() && dtype == torch::kFloat32)
      keep_16bit = nn::layer_weight_names(*slot);
    nn::load_state_dict(*slot, quantize ? rest : weights, where_from, skip, /*share_mapped=*/false,
                        keep_16bit);
    if (keep_16bit.empty()) slot->to(where, dtype);  // else: already float32 on the CPU
    // The load's freed conversions lie between the kept weights, where the next stage's
    // activations seldom fit: given back (q8_0 SD2.1-base UNet at 512: peak 1489 -> 1453 MiB).
    if (offload) device::empty_cache(torch::kCPU);
    nn::use_compute_layout(*slot);
    slot->eval();
    if (pack_conv_weights) nn::set_weight_packing(*slot, true);
    bind_loras(component, *slot);
    return slot;
  }

  // LoRA adapters of the networks this model has, each addressed by its own names: the text
  // encoder (SD 1.x/2.x, SDXL's CLIP-L), the UNet and SDXL's CLIP-G (text_encoder_2); an SDXL
  // refiner has only the last two. lora_components[i] is network i's component. Adapters are
  // merged into a network whenever it is (re)loaded and changed between generations in place.
  std::vector<std::string> lora_components;
  LoraSet loras{std::vector<io::lora::NetworkNames>{}};
  void set_lora_networks() {
    std::vector<io::lora::NetworkNames> networks;
    lora_components.clear();
    for (const auto& t : text_encoders)
      if (t.component == "text_encoder") {
        networks.push_back(io::lora::text_encoder_names());
        lora_components.push_back(t.component);
      }
    networks.push_back(io::lora::unet_names());
    lora_components.push_back("unet");
    for (const auto& t : text_encoders)
      if (t.component == "text_encoder_2") {
        networks.push_back(io::lora::text_encoder_2_names());
        lora_components.push_back(t.component);
      }
    loras = LoraSet(std::move(networks));
  }
  std::vector<LoraSpec> load_loras;  // LoadOptions::loras: in effect for every generation
  bool lora_lenient = false;
  void bind_loras(const std::string& component, torch::nn::Module& module) {
    if (loras.empty()) return;
    for (size_t i = 0; i < lora_components.size(); ++i)
      if (lora_components[i] == component) loras.bind(i, module);
  }
  models::ClipTextModel& text_encoder(size_t k = 0) {
    auto& t = text_encoders.at(k);
    return loaded(t.module, t.config, source.text_encoders.at(k).weights, t.component.c_str(),
                  text_device, text_dtype, {"text_model.embeddings.position_ids"});
  }
  // The modules of the LoRA networks in lora_components' order (nullptr: not loaded now); with
  // `load`, every one is loaded first (reading a new adapter checks it against all of them).
  std::vector<torch::nn::Module*> lora_modules(bool load) {
    std::vector<torch::nn::Module*> modules;
    for (const auto& component : lora_components) {
      if (component == "unet") {
        if (load) unet();
        modules.push_back(unet_module.is_empty() ? nullptr : unet_module.get());
        continue;
      }
      for (size_t k = 0; k < text_encoders.size(); ++k)
        if (text_encoders[k].component == component) {
          if (load) text_encoder(k);
          modules.push_back(text_encoders[k].module.is_empty() ? nullptr
                                                               : text_encoders[k].module.get());
        }
    }
    return modules;
  }
  void done_with_text_encoders() {
    for (auto& t : text_encoders) done_with(t.module, text_device);
  }
  models::UNet2DConditionModel& unet() {
    if (source.unet_file && !unet_module) return unet_from_file(*source.unet_file);
    return loaded(unet_module, unet_config, source.unet_weights, "unet", device, unet_dtype);
  }
  // A UNet file (--unet) is read tensor by tensor through its naming's table: a GGUF's
  // quantized matrices stay in their blocks, and with `weights` every other linear and
  // convolution weight is quantized as it is read, as for a folder's UNet. The layers' weights
  // get storage only when loaded plain, so a quantized layer never allocates its plain weight.
  models::UNet2DConditionModel& unet_from_file(const io::UnetFile& file) {
    {
      nn::SkipInitGuard skip_init(unet_dtype, nn::SkipInitGuard::Weights::kDeferred);
      unet_module = models::UNet2DConditionModel(unet_config);
    }
    const auto layout = file.layout;
    models::load_weights_file_quantized(
        *unet_module, file.path, weight_type, device,
        [layout](const std::vector<std::string>&) { return layout; }, file.prefix);
    unet_module->to(device, unet_dtype);  // quantized layers' placeholders are there already
    nn::use_compute_layout(*unet_module);
    unet_module->eval();
    if (pack_conv_weights) nn::set_weight_packing(*unet_module, true);
    bind_loras("unet", *unet_module);
    return unet_module;
  }
  models::AutoencoderKL& vae() {
    return loaded(vae_module, vae_config, source.vae_weights, "vae", vae_device, vae_dtype);
  }
  // With offload, frees a network after its stage (and the allocator's cached blocks).
  template <typename M>
  void done_with(M& module, const torch::Device& where) {
    if (!offload) return;
    loras.unbind(module.get());
    module = M(nullptr);
    device::empty_cache(where, device::HeapRelease::kAll);  // memory before speed
  }
};

}  // namespace diffuse::pipeline
