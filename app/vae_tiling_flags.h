// --vae-tiling auto|on|off, --vae-tile-size PX and --vae-tile-overlap F, shared by txt2img,
// img2img and edit (GenerationConfig::vae_tiling, HiDreamSampling::vae_tiling).
#pragma once
#include <CLI/CLI.hpp>

#include "diffuse/pipeline.h"

namespace diffuse::app {

void add_vae_tiling_flags(CLI::App& app, VaeTilingOptions& options);

}  // namespace diffuse::app
