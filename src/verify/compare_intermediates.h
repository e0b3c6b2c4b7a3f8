// Compares a case's "inter.<name>" tensors with the activations a model captured.
#pragma once
#include "models/intermediates.h"
#include "verify/golden.h"

namespace diffuse::verify {

// For every "inter.<name>" tensor in the case that `captured` has, adds a comparison named
// "inter.<name>". When the expected tensor holds fewer batch elements than the capture (the
// reference recorded only batch element 0, say), the capture's leading elements are compared.
// Names the model does not capture are listed in `result.details` as skipped, not failed.
void compare_intermediates(CaseResult& result, const CaseTensors& tensors,
                           const models::Intermediates& captured, double atol, double rtol);

}  // namespace diffuse::verify
