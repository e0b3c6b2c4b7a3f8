// `diffuse bench precision`: how far a dtype / attention configuration moves the pipeline's
// output. Replays every pipeline case of a golden set in the engine's float32 + math
// reference configuration and in the configuration under test, and reports the PSNR of the
// decoded images (and, for float32 runs, the error against the golden images).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace diffuse::bench {

struct PrecisionOptions {
  std::string golden;  // golden set folder (cases.json)
  std::string device = "cpu";
  std::string dtype = "bf16", vae_dtype = "auto", attention = "auto";
  std::function<void(const std::string&)> log;
};

struct PrecisionRow {
  std::string case_name;
  double psnr_db = 0;             // test vs reference image, float [0, 1]; +inf when identical
  double max_abs_diff = 0;        // test vs reference image
  double golden_max_abs_err = 0;  // test image vs the golden image (meaningful for float32)
};

std::vector<PrecisionRow> run_precision_bench(const PrecisionOptions& options);

}  // namespace diffuse::bench
