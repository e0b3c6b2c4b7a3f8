// AUTOMATIC1111's in-prompt LoRA references as adapters for one generation, for every front
// end that reads A1111 prompts (the CLI and the server).
#pragma once
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::pipeline {

// Takes every <lora:NAME[:SCALE]> tag out of `config`'s prompts and negative prompts and returns
// the files they name in `lora_dir` (DIR/NAME.safetensors), each once. InvalidArgument for the
// same name with two scales, a tag when `lora_dir` is empty, or a name that leaves the folder;
// IoError when the file does not exist.
std::vector<LoraSpec> take_prompt_loras(GenerationConfig& config, const std::string& lora_dir);

}  // namespace diffuse::pipeline
