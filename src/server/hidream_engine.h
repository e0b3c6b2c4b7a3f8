// Runs the server's jobs on one HiDream model folder: text-to-image (HiDream-I1) and
// instruction editing (HiDream-E1, or I1 + the E1-Full LoRA). The text encoders stay loaded
// between jobs, so that only the first job pays for loading them.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "server/engine.h"
#include "server/latent_preview.h"

namespace diffuse::server {

class HiDreamEngine : public Engine {
 public:
  HiDreamEngine(std::string model_path, const LoadOptions& options,
                const HiDreamEngineOptions& hidream);

  const PipelineInfo& info() const override { return info_; }
  ModelDefaults defaults() const override;
  JobOutput run(const JobRequest& request, JobContext& context) override;
  // CFG-parallel, Ulysses or both.
  void join_parallel(const parallel::ParallelGroups& groups) override;

 private:
  // One image: prompt `prompt` of the request with `seed`; reports steps done so far.
  pipeline::HiDreamResult run_one(const JobRequest& request, size_t prompt, uint64_t seed,
                                  int first_step, int total_steps, JobContext& context);

  PipelineInfo info_;
  std::unique_ptr<pipeline::HiDreamPipeline> pipe_;
  bool has_editing_lora_ = false;
  pipeline::HiDreamDefaults variant_;
  std::map<std::string, std::string> cache_defaults_;  // the folder's (dit_cache_defaults)
  LatentPreview preview_;
};

}  // namespace diffuse::server
