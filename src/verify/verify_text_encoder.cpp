#include <torch/torch.h>

#include "io/model_folder.h"
#include "models/clip_text_model.h"
#include "verify/runners.h"

namespace diffuse::verify {

CaseResult verify_text_encoder(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  CaseTensors t(c.file);
  auto folder = io::ModelFolder::open(set.model_dir());
  auto model = models::load_clip_text_model(folder, o.device, torch::kFloat32);
  auto out = model->forward(t.get("input_ids").to(o.device), /*output_hidden_states=*/true);
  double atol = c.tol("atol", 1e-5), rtol = c.tol("rtol", 0.0);
  CaseResult r;
  r.add("last_hidden_state", compare("last_hidden_state", out.last_hidden_state, t.get("last_hidden_state"), atol, rtol));
  if (t.has("pooler_output"))
    r.add("pooler_output", compare("pooler_output", out.pooler_output, t.get("pooler_output"), atol, rtol));
  for (size_t i = 0; i < out.hidden_states.size(); ++i) {
    std::string name = "hidden_states." + std::to_string(i);
    if (t.has(name)) r.add(name, compare(name, out.hidden_states[i], t.get(name), atol, rtol));
  }
  return r;
}

}  // namespace diffuse::verify
