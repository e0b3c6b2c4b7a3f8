// The model a server runs its jobs on, loaded once and kept loaded: one implementation per
// pipeline family (Stable Diffusion, HiDream, FLUX). The routes and the queue see only this.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "diffuse/pipeline.h"
#include "parallel/process_group.h"
#include "server/job_queue.h"
#include "server/requests.h"

namespace diffuse::server {

class Engine {
 public:
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  virtual const PipelineInfo& info() const = 0;
  // Defaults for requests, and the kinds of jobs and schedulers this model runs.
  virtual ModelDefaults defaults() const = 0;
  // The JobRunner of the queue.
  virtual JobOutput run(const JobRequest& request, JobContext& context) = 0;
  // A parallel server (src/server/rank_jobs.h): this rank's groups, set once after loading and
  // before any job; every job then runs over them. InvalidArgument when the family cannot
  // share its work that way (the default: no parallel runs).
  virtual void join_parallel(const parallel::ParallelGroups& groups);

  const std::string& model_path() const { return model_path_; }
  // The model's name as clients see it (the folder or file name).
  std::string model_name() const;

 protected:
  explicit Engine(std::string model_path) : model_path_(std::move(model_path)) {}

 private:
  std::string model_path_;
};

// What only a DiT model folder takes (all of it HiDream; `transformer` FLUX too).
struct HiDreamEngineOptions {
  // The transformer's component folder, or one *.safetensors / *.gguf file of its weights
  // (io::use_transformer_weights; FLUX also in BFL's original names).
  std::string transformer = "transformer";
  std::string e1_lora;  // HiDream-E1-Full: peft LoRA file on the I1 transformer
  std::optional<double> lora_alpha, lora_rank;
};

// The negative prompt of prompt `index` ("" when none was given).
const std::string& negative_prompt_for(const GenerationConfig& config, size_t index);
// Adds the seconds and steps of `t` to `sum`; memory: the last run's stages, the peak of all.
void add_timings(StageTimings& sum, const StageTimings& t);
// A job's timings as its JSON shows them: seconds per stage, s_per_step, steps, memory.
nlohmann::json timings_json(const StageTimings& t);

// The engine for the model at `path`: HiDream or FLUX for such a diffusers folder, else Stable
// Diffusion (folder or single file).
std::unique_ptr<Engine> load_engine(const std::string& path, const LoadOptions& options,
                                    const HiDreamEngineOptions& hidream = {});

}  // namespace diffuse::server
