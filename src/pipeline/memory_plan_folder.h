// The memory plan's request for a model folder, from its configs and weight-file headers only
// (no weight is read): what each network weighs in the run dtype or under --weights, the block
// units a streamed transformer holds, and estimates of each stage's working memory at a size.
// Every family (Stable Diffusion 1.x/2.x/XL, FLUX, HiDream, Qwen-Image) is recognised by its
// model_index.json.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "diffuse/pipeline.h"
#include "diffuse/timings.h"
#include "io/model_folder.h"
#include "pipeline/memory_plan.h"
#include "pipeline/model_source.h"
#include "quant/ggml_blocks.h"

namespace diffuse::pipeline {

struct FolderPlanOptions {
  int64_t width = 0, height = 0;  // 0: the family's default size
  int64_t images = 1;
  int64_t reference_images = 0;  // edits: source images whose tokens join the sequence
  torch::Device device = torch::kCPU;
  // Where the text encoders and the VAE run when not on `device`: their memory is not planned.
  std::optional<torch::Device> text_device, vae_device;
  bool text_one_at_a_time_possible = true;
  torch::Dtype dtype = torch::kBFloat16;   // the denoiser's and text encoders' compute dtype
  std::optional<torch::Dtype> text_dtype;  // the text encoders' when not `dtype`
  torch::Dtype vae_dtype = torch::kFloat32;
  std::string transformer_component = "transformer";
  std::string streaming = "auto", weight_type, vae_tiling = "auto";
  bool keep_text_encoders = false;
  int64_t max_memory = 0;  // bytes; 0: what the device has available
};

// The folder's family: "stable-diffusion", "stable-diffusion-xl", "flux", "hidream",
// "qwen-image"; ConfigError naming model_index.json's class otherwise.
std::string plan_family(const io::ModelFolder& folder);
// The family's default size (1024 for FLUX, HiDream and Qwen-Image, the UNet's sample_size
// times the VAE factor for Stable Diffusion: 512 or 768 for 1.x/2.x, 1024 for SDXL).
int64_t default_plan_side(const io::ModelFolder& folder);

PlanRequest plan_request(const io::ModelFolder& folder, const FolderPlanOptions& options);
// A Stable Diffusion model's request however it was opened (a folder or a single-file
// checkpoint): its networks from the source's weight headers or its UNet file's table. The
// pipeline holds its networks per stage (single generation) or all resident
// (options.keep_text_encoders: a batch, the server).
PlanRequest plan_request(const ModelSource& source, const FolderPlanOptions& options);
// plan_request's stages for a request whose networks are set: the budget on options.device,
// the size (options' or the family's default) and each stage's working memory, from the
// denoiser's and the VAE's configs. A pipeline that keeps its networks' request (Stable
// Diffusion's source drops its weights once loaded) plans each generation with it.
void set_plan_stages(PlanRequest& request, const std::string& family,
                     const io::JsonConfig& denoiser_config, const io::JsonConfig& vae_config,
                     const FolderPlanOptions& options);
// What `weights` (mapped files: only their headers are read) weigh once loaded in `dtype`.
int64_t loaded_bytes(const std::map<std::string, torch::Tensor>& weights, torch::Dtype dtype);

// plan_request + plan_memory.
MemoryPlan plan_folder(const io::ModelFolder& folder, const FolderPlanOptions& options);

// The options of a pipeline's plan from its settings (the DiT pipelines' set_weight_streaming,
// set_weight_type, set_keep_text_encoders, set_max_memory).
FolderPlanOptions pipeline_plan_options(torch::Device device, torch::Dtype dtype,
                                        const std::string& transformer_component,
                                        const std::string& streaming,
                                        const std::optional<quant::GgmlType>& weight_type,
                                        bool keep_text_encoders, int64_t max_memory);

// The plan of one generation at width x height: InvalidArgument with the plan's advice (what
// does not fit, what would) when nothing fits, before anything loads; else the plan, its line
// recorded in timings->plan.
MemoryPlan plan_generation(const io::ModelFolder& folder, FolderPlanOptions options, int64_t width,
                           int64_t height, int64_t reference_images,
                           const VaeTilingOptions& vae_tiling, StageTimings* timings);

// The bytes the plan may use on `device`: `max_memory` if set, else what the device has
// available less a reserve for what the plan does not count (allocator slack, the OS); 0 when
// unknown.
int64_t plan_budget(const torch::Device& device, int64_t max_memory);

}  // namespace diffuse::pipeline
