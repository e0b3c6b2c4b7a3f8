#include "models/block_streaming.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/safetensors.h"

namespace diffuse::models {

BlockWeightStream::BlockWeightStream(torch::nn::Module& module,
                                     const std::vector<std::string>& block_prefixes,
                                     torch::Device device, torch::Dtype dtype)
    : blocks_(block_prefixes.size()),
      brought_(block_prefixes.size(), false),
      device_(device),
      dtype_(dtype) {
  torch::NoGradGuard no_grad;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    for (size_t b = 0; b < block_prefixes.size(); ++b) {
      if (p.key().compare(0, block_prefixes[b].size(), block_prefixes[b]) != 0) continue;
      if (!io::is_file_mapped(p.value()))
        throw InvalidArgument("weight streaming: '" + p.key() +
                              "' does not view its file (load the model with share_mapped)");
      blocks_[b].push_back({p.value(), p.value().detach()});
      streamed_bytes_ += static_cast<int64_t>(p.value().nbytes());
      zero_copy_ = zero_copy_ && device.is_cpu() && p.value().scalar_type() == dtype;
      break;
    }
  }
  for (size_t b = 0; b < blocks_.size(); ++b) after(b);  // nothing resident to begin with
}

void BlockWeightStream::bring(size_t i) {
  if (i >= blocks_.size() || brought_[i]) return;
  brought_[i] = true;
  if (zero_copy_) {
    for (const auto& p : blocks_[i]) io::prefetch_mapped_pages(p.param);
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& p : blocks_[i])
    p.param.set_data(p.home.to(device_, dtype_, /*non_blocking=*/true, /*copy=*/true));
}

void BlockWeightStream::before(size_t i) {
  bring(i);
  bring(i + 1);
}

void BlockWeightStream::after(size_t i) {
  if (i >= blocks_.size()) return;
  brought_[i] = false;
  if (zero_copy_) {
    // Only pages still viewing the file: a weight given storage of its own (a merged LoRA
    // update) is not the file's any more and stays.
    for (const auto& p : blocks_[i]) io::release_mapped_pages(p.param);
    return;
  }
  torch::NoGradGuard no_grad;
  // The copy has been used by now: drop the file pages it was read from as well, or every
  // block read would stay in this process's resident set until the kernel needs the memory.
  for (auto& p : blocks_[i]) {
    p.param.set_data(p.home);
    io::release_mapped_pages(p.home);
  }
}

}  // namespace diffuse::models
