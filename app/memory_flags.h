// --max-memory SIZE, shared by txt2img, img2img and edit on every family: the budget the memory
// plan (pipeline/memory_plan.h) decides against instead of what the device has free.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace diffuse::app {

void add_max_memory_flag(CLI::App& app, std::string& value);
// The flag's bytes; 0 when not given. InvalidArgument naming the flag for a malformed size.
int64_t max_memory_bytes(const std::string& value);

}  // namespace diffuse::app
