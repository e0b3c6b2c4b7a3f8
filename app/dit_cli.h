// What `diffuse txt2img/edit` does the same way on both DiT families (HiDream, FLUX): the
// scheduler flag and the LoRA flags applied to a loaded pipeline.
#pragma once
#include <iostream>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "commands.h"
#include "io/model_folder.h"
#include "schedulers/scheduler.h"

namespace diffuse::app {

// What the ranks of a DiT run must agree on (join_group's job): model, seed, prompts, image,
// size, steps, guidance, weights, cache.
std::string dit_parallel_job(const DitCliFlags& f, bool edit, uint64_t seed, int steps,
                             double guidance);

// --mask/--mask-blur/--invert-mask/--mask-crop as the pipeline's options, the PNG read now (a
// bad file fails before anything loads); no mask: the defaults.
InpaintOptions dit_mask_options(const DitCliFlags& f);

// --cache with the model folder's default for a bare method name (pipeline/hidream_variant.h:
// "fbcache" -> the folder's "fbcache:0.25"); as given when the folder cannot be read (its own
// error comes with the load).
std::string dit_cache_flag(const DitCliFlags& f);

// InvalidArgument unless `name` is a flow-matching scheduler (the DiTs denoise by flow matching).
void check_flow_scheduler_name(const std::string& name);

// --scheduler and --lora on `pipe` (HiDreamPipeline or FluxPipeline); returns the LoRA lines
// for the summary, printed as they load when `talk`.
template <typename DitPipeline>
std::vector<std::string> apply_dit_flags(DitPipeline& pipe, const io::ModelFolder& folder,
                                         const DitCliFlags& f, bool talk) {
  if (!f.scheduler.empty())
    pipe.set_scheduler(schedulers::make_scheduler(
        f.scheduler, folder.component_config("scheduler", "scheduler_config.json")));
  std::vector<std::string> lora_lines;
  for (const auto& l : f.loras) {
    adapters::LoraOptions lo;
    lo.lenient = f.lora_lenient;
    lora_lines.push_back(pipe.add_lora(l.path, l.scale, lo));
    if (talk) std::cerr << "lora " << lora_lines.back() << "\n";
  }
  return lora_lines;
}

}  // namespace diffuse::app
