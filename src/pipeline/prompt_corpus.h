// Prompts of the kind users write: the text this project's own tokenizer trainers learn the
// vocabularies of the random-weight model folders from (pipeline/real_size_model.h). The demo
// model that draws pictures is trained by train/demo_trainer.h.
#pragma once
#include <string>
#include <vector>

namespace diffuse::pipeline {

const std::vector<std::string>& demo_prompt_corpus();

}  // namespace diffuse::pipeline
