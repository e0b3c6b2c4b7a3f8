// Golden runner for component "controlnet": ControlNetModel forward on the case's sample,
// timestep, encoder_hidden_states and controlnet_cond with params.conditioning_scale and
// params.guess_mode; compares every down_block_res_sample.i, mid_block_res_sample, the guess
// mode scales where stored, and every captured "inter.*". The ControlNet is params.controlnet
// (a folder relative to the set), else the case's model folder's controlnet/.
#include <torch/torch.h>

#include <filesystem>

#include "models/controlnet.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

std::string case_controlnet_dir(const GoldenSet& set, const GoldenCase& c, size_t index) {
  const auto dirs = c.param_strings("controlnet_dirs");
  if (index < dirs.size()) return set.path_inside(dirs[index], "ControlNet folder");
  if (c.params.contains("controlnet"))
    return set.path_inside(c.param("controlnet", std::string()), "ControlNet folder");
  if (index > 0)
    throw FormatError("case '" + c.name + "' names no ControlNet number " + std::to_string(index) +
                      " (params.controlnet_dirs)");
  return (std::filesystem::path(set.model_dir(c)) / "controlnet").string();
}

CaseResult verify_controlnet(const GoldenSet& set, const GoldenCase& c,
                             const VerifyOptions& options) {
  auto net =
      models::load_controlnet(case_controlnet_dir(set, c, 0), options.device, torch::kFloat32);
  CaseTensors t(c);
  models::UNetAddedConditions added;
  if (t.has("text_embeds")) added.text_embeds = t.get("text_embeds");
  if (t.has("time_ids")) added.time_ids = t.get("time_ids");
  models::Intermediates captured;
  const auto res =
      net->forward(t.get("sample").to(options.device), t.get("timestep"),
                   t.get("encoder_hidden_states").to(options.device), t.get("controlnet_cond"),
                   c.param("conditioning_scale", 1.0), c.param("guess_mode", false), &captured,
                   added.text_embeds.defined() ? &added : nullptr);
  CaseResult r;
  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  for (size_t i = 0; i < res.down.size(); ++i) {
    const auto name = "down_block_res_sample." + std::to_string(i);
    if (!t.has(name)) {
      r.add(name, Comparison{false, 0, "the ControlNet gives more residuals than the case", {}});
      continue;
    }
    r.add(name, compare(name, res.down[i].cpu(), t.get(name), atol, rtol));
  }
  if (t.has("down_block_res_sample." + std::to_string(res.down.size())))
    r.add("residual count",
          Comparison{false, 0, "the case has more residuals than the ControlNet gives", {}});
  r.add("mid_block_res_sample",
        compare("mid_block_res_sample", res.mid.cpu(), t.get("mid_block_res_sample"), atol, rtol));
  if (t.has("guess_mode_scales"))
    r.add("guess_mode_scales",
          compare("guess_mode_scales",
                  models::guess_mode_scales(static_cast<int64_t>(res.down.size()),
                                            c.param("conditioning_scale", 1.0)),
                  t.get("guess_mode_scales"), 0, 0));
  compare_intermediates(r, t, captured, atol, rtol);
  return r;
}

}  // namespace diffuse::verify
