// Runs the server's jobs on one Stable Diffusion model, loaded once and kept loaded:
// text-to-image and image-to-image share the same networks.
#pragma once
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "server/job_queue.h"
#include "server/latent_preview.h"

namespace diffuse::server {

class SdEngine {
 public:
  SdEngine(std::string model_path, const LoadOptions& options);

  const PipelineInfo& info() const { return t2i_.info(); }
  const std::string& model_path() const { return model_path_; }
  // The model's name as clients see it (the folder or file name).
  std::string model_name() const;
  // Native pixel size, for requests that give none.
  int default_width() const { return info().default_width; }
  int default_height() const { return info().default_height; }

  // The JobRunner of the queue.
  JobOutput run(const JobRequest& request, JobContext& context);

 private:
  std::string model_path_;
  Text2Image t2i_;
  Image2Image i2i_;
  LatentPreview preview_;
};

}  // namespace diffuse::server
