// The CPU share of a generation's denoising loop (diffuse/cpu_share.h) for its reports: JSON
// (CLI --json, server results) and the note the CLI prints when other work crowded it out.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "diffuse/cpu_share.h"

namespace diffuse::pipeline {

// {"threads", "cpus", "other_processes", "hypervisor", "crowded"}; the loads are in CPUs and
// null where unknown.
nlohmann::json cpu_share_json(const CpuShare& share);

// One line when the run had fewer free CPUs than threads (CpuShare::crowded), else "".
std::string cpu_share_note(const CpuShare& share);

}  // namespace diffuse::pipeline
