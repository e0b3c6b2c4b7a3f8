// Bitwise-reproducible CPU BLAS. Intel MKL (the BLAS inside PyTorch's x86 wheels) chooses its
// kernels by the operands' memory alignment unless conditional numerical reproducibility is
// on: with libtorch 2.11 on a Xeon, a float32 generation whose networks were rebuilt for each
// stage (offload) differed from the same generation on resident networks by up to 3e-6; with
// MKL_CBWR=AUTO,STRICT the images were bit-identical. MKL reads MKL_CBWR once, at its first use.
#pragma once
#include <string>

namespace diffuse::device {

// Sets MKL_CBWR=AUTO,STRICT (this CPU's best code path, results independent of alignment)
// unless MKL_CBWR is set already, which wins. Has no effect on other BLAS libraries, or once
// MKL has run. Returns the value in effect.
std::string request_reproducible_blas();

}  // namespace diffuse::device
