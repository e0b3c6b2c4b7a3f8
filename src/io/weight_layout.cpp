#include "io/weight_layout.h"

#include <torch/torch.h>

#include "diffuse/errors.h"

namespace diffuse::io {

torch::Tensor take_slice(const torch::Tensor& stored, const WeightSlice& slice,
                         const std::string& source) {
  const int64_t total = stored.dim() > 0 ? stored.size(0) : 0;
  const int64_t rows = slice.rows < 0 ? total - slice.row_begin : slice.rows;
  if (stored.dim() == 0 || slice.row_begin < 0 || rows <= 0 || slice.row_begin + rows > total)
    throw FormatError(source + ": tensor '" + slice.key + "' of shape " + c10::str(stored.sizes()) +
                      " has no rows [" + std::to_string(slice.row_begin) + ", " +
                      std::to_string(slice.row_begin + rows) + ") (does the config match it?)");
  auto t = stored.narrow(0, slice.row_begin, rows);
  if (!slice.swap_halves) return t;
  if (rows % 2 != 0)
    throw FormatError(source + ": tensor '" + slice.key + "' has an odd row count " +
                      std::to_string(rows) + "; expected two halves");
  return torch::cat({t.narrow(0, rows / 2, rows / 2), t.narrow(0, 0, rows / 2)});
}

}  // namespace diffuse::io
