// Which tokenizer / text-encoder folder of a golden set's model a case exercises. A set may
// hold several (HiDream: CLIP-L, CLIP-G, T5, Llama), and a case names its folder only
// sometimes, so the choice is made from the data: an explicit params.tokenizer_dir /
// params.text_encoder_dir first; otherwise the folders model_index.json lists are tried in
// order and the first whose files agree with everything the case states (token ids, config
// values, output width) is taken. No case name is consulted.
#pragma once
#include <string>

#include "verify/golden.h"

namespace diffuse::verify {

// Absolute path of the tokenizer folder for a "tokenizer" case.
std::string tokenizer_dir_for(const GoldenSet& set, const GoldenCase& c);

// Component name (sub-folder of the model folder) for a "text_encoder" case.
std::string text_encoder_component_for(const GoldenSet& set, const GoldenCase& c);

}  // namespace diffuse::verify
