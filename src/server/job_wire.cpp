#include "server/job_wire.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"

namespace diffuse::server {
namespace {

using nlohmann::json;

// Bumped whenever a field is added: ranks of one server run one build, and a stray message
// from another must not be read as a job.
constexpr int kWireVersion = 2;

json loras_json(const std::vector<LoraSpec>& loras) {
  json a = json::array();
  for (const auto& l : loras) a.push_back({{"path", l.path}, {"scale", l.scale}});
  return a;
}

// An 8-bit image tensor ([H, W] or [H, W, C]) as its shape and raw bytes; null when undefined.
json u8_tensor_json(const torch::Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.scalar_type() != torch::kUInt8)
    throw InvalidArgument("a parallel server job carries 8-bit images only");
  const auto c = t.contiguous();
  return {{"shape", c.sizes().vec()},
          {"bytes", json::binary(std::vector<uint8_t>(c.data_ptr<uint8_t>(),
                                                      c.data_ptr<uint8_t>() + c.numel()))}};
}

torch::Tensor u8_tensor_from(const json& j, const char* what) {
  if (j.is_null()) return {};
  const auto shape = j.at("shape").get<std::vector<int64_t>>();
  const auto& bytes = j.at("bytes").get_binary();
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 1 || d > (int64_t{1} << 16))
      throw FormatError(std::string("parallel server job: ") + what + " has a bad shape");
    n *= d;
  }
  if (shape.empty() || shape.size() > 3 || static_cast<int64_t>(bytes.size()) != n)
    throw FormatError(std::string("parallel server job: ") + what +
                      "'s bytes do not match its shape");
  return torch::from_blob(const_cast<uint8_t*>(bytes.data()), shape, torch::kUInt8).clone();
}

json conditions_json(const GenerationConfig& c) {
  const auto& m = c.inpaint;
  json units = json::array();
  for (const auto& u : c.controlnets)
    units.push_back({{"model", u.model},
                     {"image", u8_tensor_json(u.image)},
                     {"scale", u.scale},
                     {"start", u.start},
                     {"end", u.end},
                     {"preprocess", u.preprocess}});
  return {{"mask", u8_tensor_json(m.mask)}, {"blur", m.blur}, {"invert", m.invert},
          {"crop_padding", m.crop_padding}, {"fill", m.fill}, {"controlnets", units},
          {"guess_mode", c.guess_mode}};
}

void conditions_from(const json& j, GenerationConfig& c) {
  try {
    auto& m = c.inpaint;
    m.mask = u8_tensor_from(j.at("mask"), "mask");
    m.blur = j.at("blur").get<double>();
    m.invert = j.at("invert").get<bool>();
    m.crop_padding = j.at("crop_padding").get<int>();
    m.fill = j.at("fill").get<std::string>();
    for (const auto& u : j.at("controlnets")) {
      ControlNetUnit unit;
      unit.model = u.at("model").get<std::string>();
      unit.image = u8_tensor_from(u.at("image"), "control image");
      unit.scale = u.at("scale").get<double>();
      unit.start = u.at("start").get<double>();
      unit.end = u.at("end").get<double>();
      unit.preprocess = u.at("preprocess").get<std::string>();
      c.controlnets.push_back(std::move(unit));
    }
    c.guess_mode = j.at("guess_mode").get<bool>();
  } catch (const json::exception& e) {
    throw FormatError(std::string("parallel server job: mask or ControlNet fields: ") + e.what());
  }
}

json config_json(const GenerationConfig& c) {
  if (c.latents.defined() || c.noise.defined())
    throw InvalidArgument(
        "a parallel server job cannot carry initial latents or noise tensors to the other ranks");
  const auto& dc = c.deep_cache;
  const auto& tm = c.token_merging;
  const auto& dit = c.dit_cache;
  const auto& vt = c.vae_tiling;
  const auto& sc = c.size_conditioning;
  return {
      {"prompts", c.prompts},
      {"negative_prompts", c.negative_prompts},
      {"width", c.width},
      {"height", c.height},
      {"steps", c.steps},
      {"guidance_scale", c.guidance_scale},
      {"strength", c.strength},
      {"seed", c.seed ? json(*c.seed) : json(nullptr)},
      {"images_per_prompt", c.images_per_prompt},
      {"scheduler", c.scheduler},
      {"eta", c.eta},
      {"prompt_syntax", c.prompt_syntax},
      {"deep_cache", {dc.interval, dc.layer_id, dc.block_id, dc.non_uniform}},
      {"token_merging", {{"ratio", tm.ratio}, {"layers", tm.layers}, {"always", tm.always}}},
      {"denoising", {c.denoising_start, c.denoising_end}},
      {"cuda_graph", c.cuda_graph},
      {"dit_cache",
       {static_cast<int>(dit.method), dit.threshold, dit.interval, dit.order, dit.first_block,
        dit.last_block, dit.warmup}},
      {"vae_tiling", {{"mode", vt.mode}, {"tile_size", vt.tile_size}, {"overlap", vt.overlap}}},
      {"size_conditioning",
       {sc.original_width, sc.original_height, sc.crop_top, sc.crop_left, sc.target_width,
        sc.target_height, sc.aesthetic_score, sc.negative_aesthetic_score}},
      {"loras", loras_json(c.loras)},
      {"conditions", conditions_json(c)},
  };
}

// Reads field `key` of `j` into `out`, naming it on a mismatch.
template <typename T>
void read(const json& j, const char* key, T& out) {
  try {
    j.at(key).get_to(out);
  } catch (const json::exception& e) {
    throw FormatError(std::string("parallel server job: field '") + key + "': " + e.what());
  }
}

GenerationConfig config_from(const json& j) {
  GenerationConfig c;
  read(j, "prompts", c.prompts);
  read(j, "negative_prompts", c.negative_prompts);
  read(j, "width", c.width);
  read(j, "height", c.height);
  read(j, "steps", c.steps);
  read(j, "guidance_scale", c.guidance_scale);
  read(j, "strength", c.strength);
  if (!j.at("seed").is_null()) {
    uint64_t seed = 0;
    read(j, "seed", seed);
    c.seed = seed;
  }
  read(j, "images_per_prompt", c.images_per_prompt);
  read(j, "scheduler", c.scheduler);
  read(j, "eta", c.eta);
  read(j, "prompt_syntax", c.prompt_syntax);
  try {
    const auto& dc = j.at("deep_cache");
    c.deep_cache = {dc.at(0).get<int>(), dc.at(1).get<int>(), dc.at(2).get<int>(),
                    dc.at(3).get<bool>()};
    const auto& tm = j.at("token_merging");
    c.token_merging.ratio = tm.at("ratio").get<double>();
    c.token_merging.layers = tm.at("layers").get<std::vector<std::string>>();
    c.token_merging.always = tm.at("always").get<bool>();
    c.denoising_start = j.at("denoising").at(0).get<double>();
    c.denoising_end = j.at("denoising").at(1).get<double>();
    c.cuda_graph = j.at("cuda_graph").get<bool>();
    const auto& dit = j.at("dit_cache");
    const int method = dit.at(0).get<int>();
    if (method < 0 || method > static_cast<int>(DitCacheOptions::Method::kBlockSchedule))
      throw FormatError("parallel server job: unknown DiT cache method " + std::to_string(method));
    c.dit_cache.method = static_cast<DitCacheOptions::Method>(method);
    c.dit_cache.threshold = dit.at(1).get<double>();
    c.dit_cache.interval = dit.at(2).get<int>();
    c.dit_cache.order = dit.at(3).get<int>();
    c.dit_cache.first_block = dit.at(4).get<int>();
    c.dit_cache.last_block = dit.at(5).get<int>();
    c.dit_cache.warmup = dit.at(6).get<int>();
    const auto& vt = j.at("vae_tiling");
    c.vae_tiling.mode = vt.at("mode").get<std::string>();
    c.vae_tiling.tile_size = vt.at("tile_size").get<int>();
    c.vae_tiling.overlap = vt.at("overlap").get<double>();
    const auto& sc = j.at("size_conditioning");
    auto& s = c.size_conditioning;
    s.original_width = sc.at(0).get<int>();
    s.original_height = sc.at(1).get<int>();
    s.crop_top = sc.at(2).get<int>();
    s.crop_left = sc.at(3).get<int>();
    s.target_width = sc.at(4).get<int>();
    s.target_height = sc.at(5).get<int>();
    s.aesthetic_score = sc.at(6).get<double>();
    s.negative_aesthetic_score = sc.at(7).get<double>();
    for (const auto& l : j.at("loras"))
      c.loras.push_back({l.at("path").get<std::string>(), l.at("scale").get<double>()});
  } catch (const json::exception& e) {
    throw FormatError(std::string("parallel server job: accelerator or adapter fields: ") +
                      e.what());
  }
  if (!j.contains("conditions"))
    throw FormatError("parallel server job: field 'conditions' missing");
  conditions_from(j.at("conditions"), c);
  return c;
}

}  // namespace

std::string encode_job(const JobRequest& r) {
  const auto& im = r.init_image;
  json j = {{"version", kWireVersion},
            {"kind", to_string(r.kind)},
            {"config", config_json(r.config)},
            {"init_image",
             {{"width", im.width},
              {"height", im.height},
              {"rgb", json::binary(std::vector<uint8_t>(im.rgb.begin(), im.rgb.end()))}}},
            {"edit",
             {r.edit.image_guidance_scale, r.edit.clip_cfg_norm, r.edit.refine_strength,
              r.edit.auto_resize}},
            {"batch_count", r.batch_count},
            {"preview", r.preview},
            {"api", r.api}};
  const auto bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

JobRequest decode_job(const std::string& bytes) {
  json j;
  try {
    j = json::from_cbor(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    throw FormatError(std::string("parallel server job: not a job message: ") + e.what());
  }
  if (!j.is_object() || !j.contains("version") || j["version"] != kWireVersion)
    throw FormatError("parallel server job: not a job of this build (wire version " +
                      std::to_string(kWireVersion) + " expected)");
  JobRequest r;
  std::string kind;
  read(j, "kind", kind);
  const auto k = job_kind_from_string(kind);
  if (!k) throw FormatError("parallel server job: unknown kind '" + kind + "'");
  r.kind = *k;
  if (!j.contains("config") || !j["config"].is_object())
    throw FormatError("parallel server job: field 'config' missing");
  r.config = config_from(j["config"]);
  try {
    const auto& im = j.at("init_image");
    r.init_image.width = im.at("width").get<int>();
    r.init_image.height = im.at("height").get<int>();
    const auto& rgb = im.at("rgb").get_binary();
    r.init_image.rgb.assign(rgb.begin(), rgb.end());
    const auto& e = j.at("edit");
    r.edit.image_guidance_scale = e.at(0).get<double>();
    r.edit.clip_cfg_norm = e.at(1).get<bool>();
    r.edit.refine_strength = e.at(2).get<double>();
    r.edit.auto_resize = e.at(3).get<bool>();
  } catch (const json::exception& e) {
    throw FormatError(std::string("parallel server job: image or edit fields: ") + e.what());
  }
  const auto& im = r.init_image;
  if (im.width < 0 || im.height < 0 ||
      im.rgb.size() != static_cast<size_t>(im.width) * static_cast<size_t>(im.height) * 3)
    throw FormatError("parallel server job: the init image's pixels do not match its " +
                      std::to_string(im.width) + "x" + std::to_string(im.height) + " size");
  read(j, "batch_count", r.batch_count);
  read(j, "preview", r.preview);
  read(j, "api", r.api);
  return r;
}

}  // namespace diffuse::server
