// Runs the server's jobs on one Qwen-Image folder: text-to-image and, on a Qwen-Image-Edit
// folder, instruction editing (masks keep an edit inside them). Qwen2.5-VL stays loaded
// between jobs.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "pipeline/qwenimage.h"
#include "server/engine.h"
#include "server/latent_preview.h"

namespace diffuse::server {

class QwenImageEngine : public Engine {
 public:
  // `transformer`: the folder's component, or one weights file (io::use_transformer_weights).
  QwenImageEngine(std::string model_path, const LoadOptions& options,
                  const std::string& transformer = "transformer");

  const PipelineInfo& info() const override { return info_; }
  ModelDefaults defaults() const override;
  JobOutput run(const JobRequest& request, JobContext& context) override;
  // --parallel cfg (2 ranks: one true-CFG branch each) or ulysses.
  void join_parallel(const parallel::ParallelGroups& groups) override;

 private:
  PipelineInfo info_;
  std::unique_ptr<pipeline::QwenImagePipeline> pipe_;
  std::map<std::string, std::string> cache_defaults_;
  LatentPreview preview_;
};

}  // namespace diffuse::server
