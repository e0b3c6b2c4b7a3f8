#include "device/cpu_reproducibility.h"

#include <cstdlib>

namespace diffuse::device {

std::string request_reproducible_blas() {
  ::setenv("MKL_CBWR", "AUTO,STRICT", /*overwrite=*/0);
  return std::getenv("MKL_CBWR");
}

}  // namespace diffuse::device
