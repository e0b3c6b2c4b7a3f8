#include "server/request_conditions.h"

#include <filesystem>

#include "diffuse/errors.h"
#include "io/png_alpha.h"
#include "pipeline/control_image.h"
#include "pipeline/controlnet_step.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/stable_diffusion.h"
#include "server/base64.h"

namespace diffuse::server {
namespace fs = std::filesystem;
namespace {

void refuse_unless_masks(const ModelDefaults& model, const char* field) {
  if (!model.masks)
    throw InvalidArgument(std::string(field) +
                          ": this model does not inpaint with a mask (Stable Diffusion 1.x/2.x/XL "
                          "models, and FLUX Kontext and HiDream-E1 edits, do)");
}

// A base64 PNG field as uint8 [H, W, 3].
torch::Tensor image_field(const nlohmann::json& v, const std::string& what,
                          const ServerLimits& limits) {
  if (!v.is_string()) throw InvalidArgument(what + ": expected a base64 PNG string");
  return pipeline::image_to_tensor(decode_image_field(v.get<std::string>(), what, limits));
}

// A ControlNet's name (a folder in the server's --controlnet-dir, or A1111's "name [hash]").
std::string controlnet_path(const std::string& name, const ModelDefaults& model,
                            const std::string& what) {
  if (model.controlnet_dir.empty())
    throw InvalidArgument(what +
                          ": this server has no ControlNets (start it with "
                          "--controlnet-dir DIR)");
  std::string n = name;
  if (const auto bracket = n.find(" ["); bracket != std::string::npos) n.resize(bracket);
  const auto names = controlnet_names(model.controlnet_dir);
  if (std::find(names.begin(), names.end(), n) == names.end()) {
    std::string list;
    for (const auto& x : names) list += (list.empty() ? "" : ", ") + x;
    throw InvalidArgument(what + ": no ControlNet named '" + name +
                          "' (available: " + (list.empty() ? "none" : list) + ")");
  }
  return (fs::path(model.controlnet_dir) / n).string();
}

double number_in(const nlohmann::json& unit, const char* key, double fallback, double lo, double hi,
                 const std::string& what) {
  if (!unit.contains(key) || unit[key].is_null()) return fallback;
  if (!unit[key].is_number() || !(unit[key].get<double>() >= lo && unit[key].get<double>() <= hi))
    throw InvalidArgument(what + "." + key + ": expected a number in [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "]");
  return unit[key].get<double>();
}

std::string string_in(const nlohmann::json& unit, const char* key, const std::string& what) {
  if (!unit.contains(key) || unit[key].is_null()) return "";
  if (!unit[key].is_string()) throw InvalidArgument(what + "." + key + ": expected a string");
  return unit[key].get<std::string>();
}

// A mask that repaints nothing (every pixel below half grey once inverted as asked) is refused
// when the job is submitted, not when it runs.
void check_mask_repaints(const InpaintOptions& m) {
  auto gray = pipeline::mask_to_gray(m.mask);
  if (m.invert) gray = 255 - gray;
  if (!(gray >= 128).any().item<bool>())
    throw InvalidArgument("mask: all black, nothing to repaint (white = repaint" +
                          std::string(m.invert ? ", inverted" : "") + ")");
}

void check_controlnet_count(const JobRequest& r, const ModelDefaults& model) {
  if (!r.config.controlnets.empty() && !model.controlnets)
    throw InvalidArgument(
        "controlnets: ControlNets steer UNet models (Stable Diffusion "
        "1.x/2.x/XL); this model has none");
  if (r.config.controlnets.size() > 8)
    throw InvalidArgument("controlnets: at most 8 ControlNets per job");
  pipeline::validate_controlnet_units(r.config.controlnets);
}

}  // namespace

std::vector<std::string> controlnet_names(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "config.json"))
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void read_native_conditions(JsonFields& f, const nlohmann::json& body, JobRequest& r,
                            const ModelDefaults& model, const ServerLimits& limits) {
  auto& c = r.config;
  auto& m = c.inpaint;
  const bool masked = f.has("mask");
  for (const char* k : {"mask", "mask_blur", "invert_mask", "mask_crop", "inpaint_fill"})
    if (f.has(k)) {
      refuse_unless_masks(model, k);
      if (r.kind == JobKind::txt2img)
        throw InvalidArgument(std::string(k) + ": masks are for img2img and edit jobs");
      if (r.kind == JobKind::edit && std::string(k) == "mask_crop")
        throw InvalidArgument("mask_crop: for img2img jobs (an edit sees the whole source)");
      if (r.kind == JobKind::edit && std::string(k) == "inpaint_fill")
        throw InvalidArgument("inpaint_fill: for Stable Diffusion img2img jobs");
      if (!masked) throw InvalidArgument(std::string(k) + ": adjusts a mask; give \"mask\"");
    }
  if (masked) {
    f.ignore("mask");
    m.mask = image_field(body["mask"], "mask", limits);
    m.blur = f.number("mask_blur", 0, 256).value_or(0.0);
    m.invert = f.boolean("invert_mask").value_or(false);
    m.crop_padding = static_cast<int>(f.integer("mask_crop", -1, limits.max_side).value_or(-1));
    m.fill = f.string("inpaint_fill", 16).value_or("original");
    if (m.fill != "original" && m.fill != "fill" && m.fill != "latent_noise" &&
        m.fill != "latent_nothing")
      throw InvalidArgument(
          "inpaint_fill: expected original, fill, latent_noise or "
          "latent_nothing, got \"" +
          m.fill + "\"");
    check_mask_repaints(m);
  }
  if (f.has("controlnets")) {
    f.ignore("controlnets");
    const auto& units = body["controlnets"];
    if (!units.is_array()) throw InvalidArgument("controlnets: expected an array of units");
    for (size_t j = 0; j < units.size(); ++j) {
      const std::string what = "controlnets[" + std::to_string(j) + "]";
      const auto& u = units[j];
      if (!u.is_object()) throw InvalidArgument(what + ": expected an object");
      for (const auto& [k, v] : u.items())
        if (k != "model" && k != "image" && k != "scale" && k != "start" && k != "end" &&
            k != "preprocess")
          throw InvalidArgument(what + "." + k + ": unknown field");
      ControlNetUnit unit;
      unit.model = controlnet_path(string_in(u, "model", what), model, what + ".model");
      if (!u.contains("image")) throw InvalidArgument(what + ".image: required (base64 PNG)");
      unit.image = image_field(u["image"], what + ".image", limits);
      unit.scale = number_in(u, "scale", 1.0, -10, 10, what);
      unit.start = number_in(u, "start", 0.0, 0, 1, what);
      unit.end = number_in(u, "end", 1.0, 0, 1, what);
      unit.preprocess = string_in(u, "preprocess", what);
      c.controlnets.push_back(std::move(unit));
    }
  }
  c.guess_mode = f.boolean("guess_mode").value_or(false);
  if (c.guess_mode && c.controlnets.empty())
    throw InvalidArgument("guess_mode: only with controlnets");
  check_controlnet_count(r, model);
}

void read_a1111_conditions(JsonFields& f, const nlohmann::json& body, JobRequest& r,
                           const ModelDefaults& model, const ServerLimits& limits) {
  auto& c = r.config;
  if (r.kind == JobKind::img2img && f.has("mask")) {
    refuse_unless_masks(model, "mask");
    f.ignore("mask");
    auto& m = c.inpaint;
    m.mask = image_field(body["mask"], "mask", limits);
    m.blur = static_cast<double>(f.integer("mask_blur", 0, 256).value_or(4));
    m.invert = f.integer("inpainting_mask_invert", 0, 1).value_or(0) == 1;
    // inpaint_full_res ("Only masked"): a boolean, or 0/1 from older clients.
    bool full_res = true;
    if (body.contains("inpaint_full_res") && !body["inpaint_full_res"].is_null()) {
      f.ignore("inpaint_full_res");
      const auto& v = body["inpaint_full_res"];
      if (v.is_boolean())
        full_res = v.get<bool>();
      else if (v.is_number_integer() && (v.get<int>() == 0 || v.get<int>() == 1))
        full_res = v.get<int>() == 1;
      else
        throw InvalidArgument("inpaint_full_res: expected true/false (or 0/1)");
    }
    const int padding =
        static_cast<int>(f.integer("inpaint_full_res_padding", 0, limits.max_side).value_or(0));
    m.crop_padding = full_res ? padding : -1;
    static const char* kFills[] = {"fill", "original", "latent_noise", "latent_nothing"};
    m.fill = kFills[f.integer("inpainting_fill", 0, 3).value_or(1)];
    check_mask_repaints(m);
  } else {
    for (const char* k :
         {"mask_blur", "inpainting_mask_invert", "inpaint_full_res", "inpaint_full_res_padding",
          "inpainting_fill", "mask_blur_x", "mask_blur_y", "initial_noise_multiplier"})
      f.ignore(k);  // the UI sends them with every img2img request, mask or not
  }
  if (!f.has("alwayson_scripts")) return;
  f.ignore("alwayson_scripts");
  const auto& scripts = body["alwayson_scripts"];
  if (!scripts.is_object()) throw InvalidArgument("alwayson_scripts: expected an object");
  for (const auto& [name, script] : scripts.items()) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower != "controlnet")
      throw InvalidArgument("alwayson_scripts." + name + ": not supported (only controlnet)");
    if (!script.is_object() || !script.contains("args") || !script["args"].is_array())
      throw InvalidArgument("alwayson_scripts." + name + ".args: expected an array of units");
    const auto& args = script["args"];
    for (size_t j = 0; j < args.size(); ++j) {
      const std::string what = "alwayson_scripts." + name + ".args[" + std::to_string(j) + "]";
      const auto& u = args[j];
      if (!u.is_object()) throw InvalidArgument(what + ": expected an object");
      if (u.contains("enabled") && u["enabled"].is_boolean() && !u["enabled"].get<bool>()) continue;
      ControlNetUnit unit;
      unit.model = controlnet_path(string_in(u, "model", what), model, what + ".model");
      const char* image_key = u.contains("image") && !u["image"].is_null() ? "image"
                              : u.contains("input_image")                  ? "input_image"
                                                                           : nullptr;
      if (!image_key)
        throw InvalidArgument(what +
                              ".image: required (base64 PNG; the extension's "
                              "input_image is read too)");
      const auto& img = u[image_key];
      // The extension also takes {"image": base64, "mask": ...}: the image part.
      unit.image = image_field(img.is_object() && img.contains("image") ? img["image"] : img,
                               what + "." + image_key, limits);
      unit.scale = number_in(u, "weight", 1.0, -10, 10, what);
      unit.start = number_in(u, "guidance_start", 0.0, 0, 1, what);
      unit.end = number_in(u, "guidance_end", 1.0, 0, 1, what);
      const auto module = string_in(u, "module", what);
      if (module == "canny") {
        const double low = number_in(u, "threshold_a", 100, 0, 10000, what);
        const double high = number_in(u, "threshold_b", 200, 0, 10000, what);
        unit.preprocess = "canny:" + std::to_string(low) + ":" + std::to_string(high);
      } else if (!module.empty() && module != "none") {
        throw InvalidArgument(what + ".module: '" + module + "' is not available (none or canny)");
      }
      const auto mode = string_in(u, "control_mode", what);
      if (mode == "ControlNet is more important" || mode == "2") c.guess_mode = true;
      if (u.contains("guess_mode") && u["guess_mode"].is_boolean() && u["guess_mode"].get<bool>())
        c.guess_mode = true;
      c.controlnets.push_back(std::move(unit));
    }
  }
  check_controlnet_count(r, model);
}

void read_openai_mask(const std::string& png_bytes, JobRequest& r, const ModelDefaults& model,
                      const ServerLimits& limits) {
  refuse_unless_masks(model, "mask");
  std::vector<uint8_t> alpha;
  const auto img = decode_png_with_alpha(png_bytes, "mask",
                                         static_cast<uint64_t>(limits.max_upload_pixels), &alpha);
  if (img.width != r.init_image.width || img.height != r.init_image.height)
    throw InvalidArgument("mask: " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                          " pixels, the image is " + std::to_string(r.init_image.width) + "x" +
                          std::to_string(r.init_image.height) + ": they must be the same size");
  auto a = torch::from_blob(alpha.data(), {img.height, img.width}, torch::kUInt8);
  // OpenAI's rule: fully transparent pixels are repainted.
  r.config.inpaint.mask = (a == 0).to(torch::kUInt8).mul(255).contiguous();
  if (!(a == 0).any().item<bool>())
    throw InvalidArgument(
        "mask: no fully transparent pixel (OpenAI's masks mark the region to "
        "edit by alpha 0)");
}

}  // namespace diffuse::server
