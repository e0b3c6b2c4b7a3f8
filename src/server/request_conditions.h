// The parts of a request that steer where and how an image is repainted: inpainting masks
// and ControlNets, in the three APIs' own names (native jobs, AUTOMATIC1111 with the
// ControlNet extension's alwayson_scripts, OpenAI's edits mask). Every value is checked here,
// before the job is queued; ControlNets are named, never given as paths, and found in the
// server's --controlnet-dir.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "server/json_fields.h"
#include "server/requests.h"

namespace diffuse::server {

// Native: "mask" (base64 PNG, white = repaint), "mask_blur", "invert_mask", "mask_crop"
// (padding; -1 off), "inpaint_fill" (original|fill|latent_noise|latent_nothing), "controlnets"
// ([{"model": NAME, "image": base64 PNG, "scale", "start", "end", "preprocess"}]),
// "guess_mode".
void read_native_conditions(JsonFields& f, const nlohmann::json& body, JobRequest& r,
                            const ModelDefaults& model, const ServerLimits& limits);

// A1111 img2img: "mask", "mask_blur", "inpainting_mask_invert", "inpaint_full_res",
// "inpaint_full_res_padding", "inpainting_fill" (0 fill, 1 original, 2 latent noise, 3 latent
// nothing); txt2img and img2img: alwayson_scripts.controlnet.args (the extension's units:
// enabled, image/input_image, model, weight, guidance_start, guidance_end, module,
// guess_mode / control_mode "ControlNet is more important").
void read_a1111_conditions(JsonFields& f, const nlohmann::json& body, JobRequest& r,
                           const ModelDefaults& model, const ServerLimits& limits);

// OpenAI's edits mask: a PNG of the image's size whose fully transparent pixels are the region
// to repaint. -> uint8 [H, W] (255 = repaint). InvalidArgument naming the field otherwise.
void read_openai_mask(const std::string& png_bytes, JobRequest& r, const ModelDefaults& model,
                      const ServerLimits& limits);

// The ControlNet folders in `dir` (sub-folders with a config.json), by name: what the ControlNet
// extension's /controlnet/model_list lists.
std::vector<std::string> controlnet_names(const std::string& dir);

}  // namespace diffuse::server
