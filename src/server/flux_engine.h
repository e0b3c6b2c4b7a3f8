// Runs the server's jobs on one FLUX model folder: text-to-image (FLUX.1 dev/schnell) and, on
// a FLUX.1 Kontext folder, instruction editing. The text encoders stay loaded between jobs.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "pipeline/flux.h"
#include "server/engine.h"
#include "server/latent_preview.h"

namespace diffuse::server {

class FluxEngine : public Engine {
 public:
  // `transformer`: the folder's component, or one weights file (io::use_transformer_weights).
  FluxEngine(std::string model_path, const LoadOptions& options,
             const std::string& transformer = "transformer");

  const PipelineInfo& info() const override { return info_; }
  ModelDefaults defaults() const override;
  JobOutput run(const JobRequest& request, JobContext& context) override;
  // Ulysses only: FLUX's guidance is one embedding, not a batch of branches.
  void join_parallel(const parallel::ParallelGroups& groups) override;

 private:
  PipelineInfo info_;
  std::unique_ptr<pipeline::FluxPipeline> pipe_;
  std::map<std::string, std::string> cache_defaults_;  // the folder's (dit_cache_defaults)
  LatentPreview preview_;
};

}  // namespace diffuse::server
