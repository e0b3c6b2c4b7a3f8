#include "server/sd_engine.h"

#include <filesystem>
#include <set>

#include "pipeline/memory_report.h"

namespace diffuse::server {

SdEngine::SdEngine(std::string model_path, const LoadOptions& options)
    : model_path_(std::move(model_path)),
      t2i_(Text2Image::load(model_path_, options)),
      i2i_(Image2Image::sharing(t2i_)) {}

std::string SdEngine::model_name() const {
  auto p = std::filesystem::path(model_path_);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

JobOutput SdEngine::run(const JobRequest& request, JobContext& context) {
  const GenerationConfig& base = request.config;
  const uint64_t seed = base.seed.value_or(0);
  JobOutput out;
  double text = 0, encode = 0, denoise = 0, decode = 0, total = 0;
  size_t steps_run = 0;
  int64_t peak_rss = 0;
  nlohmann::json memory;
  std::set<std::string> warnings;
  for (int b = 0; b < request.batch_count; ++b) {
    GenerationConfig g = base;
    g.seed = seed + static_cast<uint64_t>(b);
    auto on_step = [&](const StepEvent& e) {
      std::string preview;
      if (request.preview && e.latents) preview = encode_png(preview_.project(*e.latents));
      return context.step(b * e.num_steps + e.step + 1, request.batch_count * e.num_steps,
                          std::move(preview));
    };
    GenerationResult r = request.kind == JobKind::txt2img
                             ? t2i_.generate(g, on_step)
                             : i2i_.generate(g, request.init_image, on_step);
    preview_.learn(r.latents, r.images_float);
    for (size_t i = 0; i < r.images.size(); ++i) {
      const size_t prompt = i / static_cast<size_t>(g.images_per_prompt);
      pipeline::ImageParameters p;
      p.prompt = g.prompts[prompt];
      p.negative_prompt = g.negative_prompts.empty()       ? ""
                          : g.negative_prompts.size() == 1 ? g.negative_prompts[0]
                                                           : g.negative_prompts[prompt];
      p.steps = g.steps;
      p.scheduler = g.scheduler.empty() ? info().scheduler : g.scheduler;
      p.cfg_scale = g.guidance_scale;
      p.seed = r.seed;
      p.width = r.images[i].width;
      p.height = r.images[i].height;
      p.model = model_path_;
      if (request.kind == JobKind::img2img) p.strength = g.strength;
      p.device = info().device;
      p.dtype = info().unet_dtype;
      out.images.push_back({encode_png(r.images[i], p.png_chunks()), p});
    }
    const auto& t = r.timings;
    text += t.text_encode_s;
    encode += t.vae_encode_s;
    denoise += t.denoise_s;
    decode += t.vae_decode_s;
    total += t.total_s;
    steps_run += t.step_s.size();
    peak_rss = std::max(peak_rss, t.peak_rss_bytes);
    memory = pipeline::memory_json(t.memory);
    for (const auto& w : r.warnings)
      if (warnings.insert(w).second) out.warnings.push_back(w);
  }
  out.timings = {{"text_encode_s", text},
                 {"vae_encode_s", encode},
                 {"denoise_s", denoise},
                 {"s_per_step", steps_run ? denoise / static_cast<double>(steps_run) : 0.0},
                 {"steps", steps_run},
                 {"vae_decode_s", decode},
                 {"total_s", total},
                 {"peak_rss_bytes", peak_rss},
                 {"memory", memory}};
  return out;
}

}  // namespace diffuse::server
