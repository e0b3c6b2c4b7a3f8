// Runs golden cases through the engine: `diffuse verify` and the golden tests share this.
#pragma once
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quant/ggml_blocks.h"
#include "verify/golden.h"

namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::verify {

struct VerifyOptions {
  torch::Device device = torch::kCPU;
  std::vector<std::string> components;  // empty = all
  // The denoisers' cases (unet, transformer) run with the linear layers' weights kept in this
  // ggml type (a quantization round trip of the float32 model), and every output is compared
  // within quantized_tolerance(type) of the largest magnitude of its expected tensor instead of
  // the case's tolerance. Cases of other components are not run.
  std::optional<quant::GgmlType> weights;
  // HiDream and FLUX pipeline cases run with Ulysses sequence parallelism over this group (every
  // rank runs the same case; parallel/ulysses.h). Null: one device.
  std::shared_ptr<parallel::RankGroup> sequence_group;
  // ... and HiDream's CFG-parallel over this one (HiDreamPipeline::set_cfg_group); both:
  // cfg,ulysses.
  std::shared_ptr<parallel::RankGroup> cfg_group;
};

// The stated tolerance of a verify run with quantized weights, as the relative RMS error of each
// compared tensor (compare_relative_rms): q8_0 0.05, q4_0 0.6. Rounding moves each weight by
// at most half a step of its 32-value block (RMS ~1/440 of the block's largest value for q8_0,
// ~1/28 for q4_0); through the networks' layers the golden sets measure at most 1.9 % (q8_0)
// and 42 % (q4_0, an intermediate of the padded HiDream case; outputs up to 21 %).
double quantized_tolerance(quant::GgmlType type);
// Components whose cases a quantized verify run covers.
bool quantizable_component(const std::string& component);

// Runs one case; never throws: errors become a failed result with the message as reason.
// A component without a runner fails with reason "unsupported component".
CaseResult run_case(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);
// Runs every case whose component is selected, after checking the set's listed model files
// (FormatError "golden file corrupted: ..." if one differs; case files are checked as read).
std::vector<CaseResult> run_all(const GoldenSet& set, const VerifyOptions& options);
// Components this build can verify.
std::vector<std::string> supported_components();

}  // namespace diffuse::verify
