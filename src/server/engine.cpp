#include "server/engine.h"

#include <filesystem>

#include "device/cpu_load.h"
#include "diffuse/errors.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/memory_report.h"
#include "pipeline/qwenimage.h"
#include "server/flux_engine.h"
#include "server/hidream_engine.h"
#include "server/qwenimage_engine.h"
#include "server/sd_engine.h"

namespace fs = std::filesystem;

namespace diffuse::server {

std::string Engine::model_name() const {
  auto p = fs::path(model_path_);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

void Engine::join_parallel(const parallel::ParallelGroups& /*groups*/) {
  throw InvalidArgument("this model's server runs on one device (no parallel jobs)");
}

const std::string& negative_prompt_for(const GenerationConfig& config, size_t index) {
  static const std::string none;
  const auto& n = config.negative_prompts;
  return n.empty() ? none : n.size() == 1 ? n[0] : n.at(index);
}

void add_timings(StageTimings& sum, const StageTimings& t) {
  sum.text_encode_s += t.text_encode_s;
  sum.vae_encode_s += t.vae_encode_s;
  sum.denoise_s += t.denoise_s;
  sum.vae_decode_s += t.vae_decode_s;
  sum.total_s += t.total_s;
  sum.step_s.insert(sum.step_s.end(), t.step_s.begin(), t.step_s.end());
  sum.peak_rss_bytes = std::max(sum.peak_rss_bytes, t.peak_rss_bytes);
  sum.memory = t.memory;
  sum.cpu = t.cpu;  // the last generation's
}

nlohmann::json timings_json(const StageTimings& t) {
  const size_t steps = t.step_s.size();
  return {{"text_encode_s", t.text_encode_s},
          {"vae_encode_s", t.vae_encode_s},
          {"denoise_s", t.denoise_s},
          {"s_per_step", steps ? t.denoise_s / static_cast<double>(steps) : 0.0},
          {"steps", steps},
          {"vae_decode_s", t.vae_decode_s},
          {"total_s", t.total_s},
          {"peak_rss_bytes", t.peak_rss_bytes},
          {"memory", pipeline::memory_json(t.memory)},
          {"cpu", device::cpu_share_json(t.cpu)}};
}

std::unique_ptr<Engine> load_engine(const std::string& path, const LoadOptions& options,
                                    const HiDreamEngineOptions& hidream) {
  const bool qwen = pipeline::is_qwenimage_folder(path);
  if (!options.unet_file.empty() &&
      (pipeline::is_hidream_folder(path) || pipeline::is_flux_folder(path) || qwen))
    throw InvalidArgument("--unet: a Stable Diffusion UNet file, and '" + path +
                          "' is a DiT model folder (give its transformer with --transformer FILE)");
  if (pipeline::is_hidream_folder(path))
    return std::make_unique<HiDreamEngine>(path, options, hidream);
  const bool flux = pipeline::is_flux_folder(path);
  if (!hidream.e1_lora.empty())
    throw InvalidArgument("--e1-lora: only for HiDream model folders, and '" + path +
                          "' is not one");
  if (!flux && !qwen && hidream.transformer != HiDreamEngineOptions{}.transformer)
    throw InvalidArgument(
        "--transformer: only for HiDream, FLUX and Qwen-Image model folders, "
        "and '" +
        path + "' is none of them");
  if (flux) return std::make_unique<FluxEngine>(path, options, hidream.transformer);
  if (qwen) return std::make_unique<QwenImageEngine>(path, options, hidream.transformer);
  return std::make_unique<SdEngine>(path, options);
}

}  // namespace diffuse::server
