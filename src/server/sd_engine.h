// Runs the server's jobs on one Stable Diffusion model: text-to-image and image-to-image share
// the same networks.
#pragma once
#include <string>

#include "server/engine.h"
#include "server/latent_preview.h"

namespace diffuse::server {

class SdEngine : public Engine {
 public:
  SdEngine(std::string model_path, const LoadOptions& options);

  const PipelineInfo& info() const override { return t2i_.info(); }
  ModelDefaults defaults() const override;
  JobOutput run(const JobRequest& request, JobContext& context) override;
  // CFG-parallel: the ranks share the guidance branches (no token split in a UNet).
  void join_parallel(const parallel::ParallelGroups& groups) override;

 private:
  Text2Image t2i_;
  Image2Image i2i_;
  LatentPreview preview_;
};

}  // namespace diffuse::server
