// Compares a case's "inter.<name>" tensors with the activations a model captured.
#pragma once
#include <optional>

#include "models/intermediates.h"
#include "quant/ggml_blocks.h"
#include "verify/golden.h"

namespace diffuse::verify {

// For every "inter.<name>" tensor in the case that `captured` has, adds a comparison named
// "inter.<name>". When the expected tensor holds fewer batch elements than the capture (the
// reference recorded only batch element 0, say), the capture's leading elements are compared.
// Names the model does not capture are listed in `result.details` as skipped, not failed.
// `relative` > 0: each tensor within that relative RMS error instead (compare_relative_rms).
void compare_intermediates(CaseResult& result, const CaseTensors& tensors,
                           const models::Intermediates& captured, double atol, double rtol,
                           double relative = 0);

// A network case: its "out" and every captured intermediate, with the case's atol/rtol (1e-4,
// 0 unless it says otherwise); with `quantized` weights (VerifyOptions::weights), within
// quantized_tolerance as a relative RMS error.
CaseResult compare_network_outputs(const GoldenCase& c, const CaseTensors& tensors,
                                   const torch::Tensor& out, const models::Intermediates& captured,
                                   std::optional<quant::GgmlType> quantized = std::nullopt);

}  // namespace diffuse::verify
