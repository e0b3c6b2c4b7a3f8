// Token batches as the tensors the text encoders take.
#pragma once
#include <torch/types.h>

#include "text/token_batch.h"

namespace diffuse::pipeline {

// A TokenBatch as int64 tensors [n, L] (ids, mask) on the CPU.
torch::Tensor token_ids_tensor(const text::TokenBatch& batch);
torch::Tensor token_mask_tensor(const text::TokenBatch& batch);

}  // namespace diffuse::pipeline
