// Golden runner for component "lora": a peft LoRA file (HiDream-E1-Full style: low-rank pairs
// plus full tensors that replace base weights) merged into the base HiDream transformer, then
// the transformer forward as in verify_transformer. "out" is compared with the adapter active,
// "out_adapters_disabled" after peft's disable_adapters() (the full tensors stay loaded).
// The file and peft's LoraConfig (lora_alpha, r) come from the case's params (lora_file,
// lora_alpha, rank), else from the set's "e1_weights" entry.
#include <torch/torch.h>

#include "adapters/lora_merger.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

template <typename T>
T setting(const GoldenSet& set, const GoldenCase& c, const char* case_key, const char* set_key) {
  if (c.params.contains(case_key)) return c.param(case_key, T{});
  const auto w = set.index.value("e1_weights", nlohmann::json::object());
  if (w.is_object() && w.contains(set_key)) {
    if (std::is_same_v<T, std::string> ? !w[set_key].is_string() : !w[set_key].is_number())
      throw FormatError(set.dir + "/cases.json: e1_weights." + set_key + " is " +
                        w[set_key].dump().substr(0, 80) + ", expected " +
                        (std::is_same_v<T, std::string> ? "a path" : "a number"));
    return w[set_key].get<T>();
  }
  throw FormatError(c.where + ": neither params." + case_key + " nor e1_weights." + set_key +
                    " is given");
}

}  // namespace

CaseResult verify_lora(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options) {
  auto folder = io::ModelFolder::open(set.model_dir());
  const std::string component = c.param("component", std::string("transformer"));
  auto model = models::load_hidream_transformer(folder, options.device, torch::kFloat32, component);

  adapters::LoraOptions lo;
  lo.alpha = setting<double>(set, c, "lora_alpha", "lora_alpha");
  lo.rank = setting<double>(set, c, "rank", "lora_rank");
  const std::string file =
      set.path_inside(setting<std::string>(set, c, "lora_file", "lora_file"), "lora_file");
  adapters::LoraMerger merger({{io::lora::transformer_names(), model.get()}});
  merger.add(file, 1.0, lo);

  CaseTensors tensors(c);
  models::HiDreamForwardOptions fwd;
  fwd.max_seq = c.param("max_seq", int64_t{0});
  auto run = [&] {
    return model->forward(tensors.get("x").to(options.device), tensors.get("timesteps"),
                          tensors.get("t5"), tensors.get("llama"), tensors.get("pooled"), fwd);
  };
  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  CaseResult result;
  result.add("out", compare("out", run(), tensors.get("out"), atol, rtol));
  if (tensors.has("out_adapters_disabled")) {
    merger.set_lora_enabled(false);
    result.add("out_adapters_disabled", compare("out_adapters_disabled", run(),
                                                tensors.get("out_adapters_disabled"), atol, rtol));
  }
  return result;
}

}  // namespace diffuse::verify
