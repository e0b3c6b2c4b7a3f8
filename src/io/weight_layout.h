// Weights written in another key layout than the module that reads them (a mapping table such
// as BFL's FLUX names, models/flux_bfl_names.h): where each of the module's parameters sits in
// the file. Used by the component loader (models/load_component.h) and by LoRA files named
// after the same layout (adapters/lora.h), so one table serves both.
#pragma once
#include <torch/types.h>

#include <map>
#include <string>

namespace diffuse::io {

// One parameter's place in the file: the file's tensor, a range of its rows (fused projections
// split on load), and whether its two row halves are in the other order.
struct WeightSlice {
  std::string key;        // the tensor in the file
  int64_t row_begin = 0;  // rows [row_begin, row_begin + rows) of dimension 0
  int64_t rows = -1;      // -1: every row
  bool swap_halves = false;
};
// The module's parameter name -> its slice of the file.
using WeightLayout = std::map<std::string, WeightSlice>;

// `stored` (the file's tensor, ggml blocks as [rows, row_bytes], or a LoRA's up matrix) cut down
// to `slice`; FormatError naming `source` and the tensor when the rows are not there or do not
// halve.
torch::Tensor take_slice(const torch::Tensor& stored, const WeightSlice& slice,
                         const std::string& source);

}  // namespace diffuse::io
