#include "nn/load_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <sstream>

#include "diffuse/errors.h"
#include "io/safetensors.h"
#include "nn/layers.h"

namespace diffuse::nn {

// isfinite over slices of 4M values: the temporaries stay small and are reused, instead of one
// tensor-sized mask per weight (with glibc's growing mmap threshold, those piled up in the heap:
// 10 GiB of anonymous memory while checking a streamed 17B model).
bool all_finite(const torch::Tensor& t) {
  const auto flat = t.reshape({-1});
  constexpr int64_t kSlice = int64_t{1} << 22;
  for (int64_t at = 0; at < flat.numel(); at += kSlice)
    if (!torch::isfinite(flat.narrow(0, at, std::min(kSlice, flat.numel() - at)))
             .all()
             .item<bool>())
      return false;
  return true;
}

namespace {

// One pass over a loaded tensor: a single NaN in conv_in.weight is enough to make every image
// black, so such a file is refused at load, naming the tensor.
void check_finite(const torch::Tensor& loaded, const torch::Tensor& stored,
                  const std::string& source, const std::string& key) {
  if (!loaded.is_floating_point() || all_finite(loaded)) return;
  const int64_t bad = loaded.numel() - torch::isfinite(loaded).sum().item<int64_t>();
  const bool in_file = !stored.is_floating_point() || !torch::isfinite(stored).all().item<bool>();
  throw FormatError(
      source + ": tensor '" + key + "' has " + std::to_string(bad) + " non-finite value" +
      (bad == 1 ? "" : "s") + " (NaN/Inf) " +
      (in_file ? std::string("in the file (a damaged file, or one saved after training diverged)")
               : "after conversion to " + std::string(c10::toString(loaded.scalar_type())) +
                     ": the file's values exceed that type's range; load it in bf16 or fp32 "
                     "(--dtype)"));
}

}  // namespace

LoadReport load_state_dict(torch::nn::Module& module,
                           const std::map<std::string, torch::Tensor>& weights,
                           const std::string& source, const std::set<std::string>& ignored,
                           bool share_mapped, const std::set<std::string>& keep_16bit,
                           const std::function<void(const torch::Tensor&)>& copied) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    if (it == weights.end()) {
      if (!ignored.count(item.key())) missing.push_back(item.key());
      continue;
    }
    auto& param = item.value();
    if (param.sizes() != it->second.sizes())
      throw FormatError(source + ": tensor '" + item.key() + "' has shape " +
                        c10::str(it->second.sizes()) + ", the model expects " +
                        c10::str(param.sizes()));
    const auto file_dtype = it->second.scalar_type();
    if (param.scalar_type() == torch::kFloat32 &&
        (file_dtype == torch::kHalf || file_dtype == torch::kBFloat16) &&
        keep_16bit.count(item.key())) {
      // A fresh copy (not a view of the mapping), on the parameter's device.
      param.set_data(it->second.to(param.device(), file_dtype, /*non_blocking=*/false,
                                   /*copy=*/true));
      check_finite(param, it->second, source, item.key());
    } else if (share_mapped && io::is_file_mapped(it->second)) {
      param.set_data(it->second);  // views the file: streamed, nothing copied
      check_finite(it->second, it->second, source, item.key());
    } else if (has_deferred_storage(param)) {
      param.set_data(it->second.to(param.device(), param.scalar_type(), /*non_blocking=*/false,
                                   /*copy=*/true, c10::MemoryFormat::Contiguous));
      check_finite(param, it->second, source, item.key());
    } else {
      param.copy_(it->second);
      check_finite(param, it->second, source, item.key());
    }
    io::release_mapped_pages(it->second);  // the file's pages leave the RSS (read again on use)
    if (copied) copied(it->second);
    used.insert(item.key());
  }
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    if (it == weights.end()) continue;
    if (item.value().sizes() != it->second.sizes())
      throw FormatError(source + ": buffer '" + item.key() + "' has shape " +
                        c10::str(it->second.sizes()) + ", the model expects " +
                        c10::str(item.value().sizes()));
    item.value().copy_(it->second);
    check_finite(item.value(), it->second, source, item.key());
    if (copied) copied(it->second);
    used.insert(item.key());
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
    throw FormatError(source + ": missing weights for the model's parameters: " + list +
                      " (is this the right model type / config?)");
  }
  LoadReport report;
  for (const auto& kv : weights)
    if (!used.count(kv.first) && !ignored.count(kv.first)) report.unexpected.insert(kv.first);
  return report;
}

}  // namespace diffuse::nn
