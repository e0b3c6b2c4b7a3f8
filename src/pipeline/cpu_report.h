// The note the CLI prints when other work crowded out a generation's denoising loop
// (diffuse/cpu_share.h; its JSON is device::cpu_share_json).
#pragma once
#include <string>

#include "diffuse/cpu_share.h"

namespace diffuse::pipeline {

// One line when the run had fewer free CPUs than threads (CpuShare::crowded), else "".
std::string cpu_share_note(const CpuShare& share);

}  // namespace diffuse::pipeline
