// One runner per component; each lives in verify_<component>.cpp and reads everything it
// needs (inputs, params, tolerances, model folder) from the case and the set.
#pragma once
#include "verify/verify.h"

namespace diffuse::verify {

CaseResult verify_scheduler(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);

}  // namespace diffuse::verify
