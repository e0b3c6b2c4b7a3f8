// Weight streaming for networks larger than memory (HiDream-I1's 17B transformer is ~34 GB in
// bf16, more than a 24 GiB machine holds): the blocks' weights stay in their memory-mapped
// safetensors files and are brought in block by block as the blocks run.
//
// On the CPU, with the file in the compute dtype, a block's parameters simply view the mapping
// (no copy at all): before a block runs the OS is asked to read the next block's pages ahead
// (madvise WILLNEED, so disk reads overlap this block's compute), and after it ran its pages are
// given back (MADV_DONTNEED), so the resident set holds about two blocks instead of the whole
// model. Elsewhere (another device, or a file in another dtype) each block's weights are copied
// to the device in the compute dtype just before it runs and freed right after, the next
// block's copy being issued first.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace diffuse::models {

class BlockWeightStream {
 public:
  // `module`'s parameters whose names start with one of `block_prefixes` (in run order, e.g.
  // "double_stream_blocks.0.") are streamed. The module must have been loaded with
  // share_mapped, so that those parameters view their file tensors (nn/load_weights.h); they
  // are placed for `device` / `dtype` block by block. InvalidArgument if a block parameter
  // does not view a file.
  BlockWeightStream(torch::nn::Module& module, const std::vector<std::string>& block_prefixes,
                    torch::Device device, torch::Dtype dtype);

  // Block `i`'s weights are ready where it runs, and block i + 1's are on their way.
  void before(size_t i);
  // Block `i`'s weights leave memory.
  void after(size_t i);

  size_t blocks() const { return blocks_.size(); }
  bool zero_copy() const { return zero_copy_; }
  int64_t streamed_bytes() const { return streamed_bytes_; }

 private:
  struct Param {
    torch::Tensor param;  // the module's parameter (shares its TensorImpl)
    torch::Tensor home;   // the file tensor (mapped)
  };
  void bring(size_t i);

  std::vector<std::vector<Param>> blocks_;
  std::vector<bool> brought_;
  torch::Device device_;
  torch::Dtype dtype_;
  bool zero_copy_ = true;
  int64_t streamed_bytes_ = 0;
};

}  // namespace diffuse::models
