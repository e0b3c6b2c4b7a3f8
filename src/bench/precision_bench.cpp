#include "bench/precision_bench.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "verify/golden.h"
#include "verify/pipeline_replay.h"

namespace diffuse::bench {

std::vector<PrecisionRow> run_precision_bench(const PrecisionOptions& o) {
  auto set = verify::GoldenSet::load(o.golden);
  std::vector<PrecisionRow> rows;
  for (const auto& c : set.cases) {
    if (c.component != "pipeline") continue;
    LoadOptions ref;
    ref.device = o.device;
    ref.dtype = "fp32";
    ref.vae_dtype = "fp32";
    ref.attention = "math";
    LoadOptions test = ref;
    test.dtype = o.dtype;
    test.vae_dtype = o.vae_dtype;
    test.attention = o.attention;
    auto a = verify::replay_pipeline_case(set, c, set.model_dir(c), ref)
                 .result.images_float.to(torch::kFloat64);
    auto b = verify::replay_pipeline_case(set, c, set.model_dir(c), test)
                 .result.images_float.to(torch::kFloat64);
    PrecisionRow row;
    row.case_name = c.name;
    const double mse = (a - b).pow(2).mean().item<double>();
    row.psnr_db = mse > 0 ? 10.0 * std::log10(1.0 / mse) : std::numeric_limits<double>::infinity();
    row.max_abs_diff = (a - b).abs().max().item<double>();
    verify::CaseTensors t(c);
    if (t.has("image")) {
      auto golden = t.get("image").to(torch::kFloat64);
      if (golden.sizes() == b.sizes())
        row.golden_max_abs_err = (b - golden).abs().max().item<double>();
    }
    if (o.log) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s: PSNR %.2f dB, max |diff| %.4f", c.name.c_str(), row.psnr_db,
               row.max_abs_diff);
      o.log(buf);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace diffuse::bench
