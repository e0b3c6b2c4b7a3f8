// Golden runner for the text encoders: CLIPTextModel(WithProjection), T5EncoderModel and
// LlamaForCausalLM (hidden-state stack), chosen by the class of the folder the case exercises
// (text_components.h).
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/clip_text_model.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "verify/runners.h"
#include "verify/text_components.h"

namespace diffuse::verify {
namespace {

// model_index.json's class of the component, else config.json's architectures[0].
std::string encoder_class(const io::ModelFolder& folder, const std::string& component) {
  std::string cls = folder.component_class(component);
  if (!cls.empty()) return cls;
  const auto cfg = folder.component_config(component).json();
  if (cfg.contains("architectures") && cfg["architectures"].is_array() &&
      !cfg["architectures"].empty() && cfg["architectures"][0].is_string())
    return cfg["architectures"][0].get<std::string>();
  return "CLIPTextModel";
}

void compare_hidden_states(CaseResult& r, const CaseTensors& t,
                           const std::vector<torch::Tensor>& states, double atol, double rtol) {
  for (size_t i = 0; i < states.size(); ++i) {
    std::string name = "hidden_states." + std::to_string(i);
    if (t.has(name)) r.add(name, compare(name, states[i], t.get(name), atol, rtol));
  }
}

CaseResult run_clip(const io::ModelFolder& folder, const std::string& component,
                    const CaseTensors& t, const VerifyOptions& o, double atol, double rtol) {
  auto model = models::load_clip_text_model(folder, o.device, torch::kFloat32, component);
  auto out = model->forward(t.get("input_ids").to(o.device), /*output_hidden_states=*/true);
  CaseResult r;
  r.add("last_hidden_state", compare("last_hidden_state", out.last_hidden_state,
                                     t.get("last_hidden_state"), atol, rtol));
  if (t.has("pooler_output"))
    r.add("pooler_output",
          compare("pooler_output", out.pooler_output, t.get("pooler_output"), atol, rtol));
  if (t.has("text_embeds")) {
    if (!out.text_embeds.defined())
      throw FormatError(folder.component_dir(component) +
                        ": the case expects text_embeds but the model has no text_projection");
    r.add("text_embeds", compare("text_embeds", out.text_embeds, t.get("text_embeds"), atol, rtol));
  }
  // SDXL's prompt embeddings: the penultimate layer's output, before the final layer norm.
  if (t.has("penultimate")) {
    if (out.hidden_states.size() < 2)
      throw FormatError(folder.component_dir(component) +
                        ": the case expects a penultimate hidden state, the model has one layer");
    r.add("penultimate", compare("penultimate", out.hidden_states[out.hidden_states.size() - 2],
                                 t.get("penultimate"), atol, rtol));
  }
  compare_hidden_states(r, t, out.hidden_states, atol, rtol);
  return r;
}

CaseResult run_t5(const io::ModelFolder& folder, const std::string& component, const CaseTensors& t,
                  const VerifyOptions& o, double atol, double rtol) {
  auto model = models::load_t5_encoder(folder, component, o.device, torch::kFloat32);
  torch::Tensor mask =
      t.has("attention_mask") ? t.get("attention_mask").to(o.device) : torch::Tensor();
  auto out = model->forward(t.get("input_ids").to(o.device), mask, /*output_hidden_states=*/true);
  CaseResult r;
  r.add("last_hidden_state", compare("last_hidden_state", out.last_hidden_state,
                                     t.get("last_hidden_state"), atol, rtol));
  compare_hidden_states(r, t, out.hidden_states, atol, rtol);
  return r;
}

// LlamaForCausalLM as HiDream uses it: prompt_embeds_llama3 = hidden_states[1:] stacked.
CaseResult run_llama(const io::ModelFolder& folder, const std::string& component,
                     const CaseTensors& t, const VerifyOptions& o, double atol, double rtol) {
  auto model = models::load_llama(folder, component, o.device, torch::kFloat32);
  torch::Tensor mask =
      t.has("attention_mask") ? t.get("attention_mask").to(o.device) : torch::Tensor();
  auto out = model->forward(t.get("input_ids").to(o.device), mask);
  CaseResult r;
  if (t.has("prompt_embeds_llama3"))
    r.add("prompt_embeds_llama3", compare("prompt_embeds_llama3", out.stacked(),
                                          t.get("prompt_embeds_llama3"), atol, rtol));
  if (t.has("embeddings"))
    r.add("embeddings",
          compare("embeddings", out.hidden_states.front(), t.get("embeddings"), atol, rtol));
  compare_hidden_states(r, t, out.hidden_states, atol, rtol);
  return r;
}

}  // namespace

CaseResult verify_text_encoder(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  CaseTensors t(c);
  auto folder = io::ModelFolder::open(set.model_dir());
  const std::string component = text_encoder_component_for(set, c);
  const std::string cls = encoder_class(folder, component);
  const double atol = c.tol("atol", 1e-5), rtol = c.tol("rtol", 0.0);
  if (cls == "CLIPTextModel" || cls == "CLIPTextModelWithProjection")
    return run_clip(folder, component, t, o, atol, rtol);
  if (cls == "T5EncoderModel") return run_t5(folder, component, t, o, atol, rtol);
  if (cls == "LlamaForCausalLM") return run_llama(folder, component, t, o, atol, rtol);
  throw FormatError(folder.component_dir(component) + ": text encoder class '" + cls +
                    "' has no runner (expected CLIPTextModel, CLIPTextModelWithProjection or "
                    "T5EncoderModel or LlamaForCausalLM)");
}

}  // namespace diffuse::verify
