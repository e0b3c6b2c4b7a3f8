#include "pipeline/component_writer.h"

#include <torch/torch.h>

#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace diffuse::pipeline {

void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j) {
  std::filesystem::create_directories(path.parent_path());
  io::write_file_atomically(path.string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

nlohmann::ordered_json stable_diffusion_model_index(const std::string& scheduler_class,
                                                    const std::string& note) {
  return {{"_class_name", "StableDiffusionPipeline"},
          {"_diffuse_note", note},
          {"scheduler", {"diffusers", scheduler_class}},
          {"text_encoder", {"transformers", "CLIPTextModel"}},
          {"tokenizer", {"transformers", "CLIPTokenizer"}},
          {"unet", {"diffusers", "UNet2DConditionModel"}},
          {"vae", {"diffusers", "AutoencoderKL"}},
          {"safety_checker", {nullptr, nullptr}},
          {"feature_extractor", {nullptr, nullptr}},
          {"requires_safety_checker", false}};
}

void save_module_weights(torch::nn::Module& module, const std::filesystem::path& path, bool half,
                         const std::string& made_by) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters(true))
    tensors.emplace_back(p.key(), half ? p.value().to(torch::kFloat16) : p.value().detach());
  std::filesystem::create_directories(path.parent_path());
  io::save_safetensors(path.string(), tensors, {{"format", "pt"}, {"made_by", made_by}});
}

}  // namespace diffuse::pipeline
