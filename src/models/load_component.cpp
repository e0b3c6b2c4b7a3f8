#include "models/load_component.h"

#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/ldm_checkpoint.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"
#include "nn/load_weights.h"
#include "quant/quantized_weight.h"

namespace diffuse::models {

io::JsonConfig component_config(const io::ModelFolder& folder, const std::string& component,
                                const std::string& expected_class) {
  auto cfg = folder.component_config(component);
  auto cls = cfg.get<std::string>("_class_name", expected_class);
  if (cls != expected_class)
    cfg.fail("_class_name", "expected \"" + expected_class + "\", got \"" + cls + "\"");
  return cfg;
}

namespace {

void refuse_unexpected(const nn::LoadReport& report, const std::string& source) {
  if (report.unexpected.empty()) return;
  std::string list;
  size_t shown = 0;
  for (const auto& name : report.unexpected) {
    if (shown++ == 5) break;
    list += (list.empty() ? "" : ", ") + name;
  }
  if (report.unexpected.size() > 5)
    list += ", ... (" + std::to_string(report.unexpected.size()) + " in all)";
  throw FormatError(source +
                    ": the weights have tensors the model built from config.json does not have: " +
                    list + " (does config.json match the weights?)");
}

// A GGUF Q8_0/Q4_0 matrix whose fp16 scales are all finite (a NaN there makes every value of
// its block NaN); other types are not checked block by block.
void check_block_scales(const quant::QuantizedWeight& q, const std::string& source,
                        const std::string& key) {
  if (!quant::dequantizes_on_device(q.type)) return;
  const auto& t = quant::ggml_type_traits(q.type);
  const auto scales =
      q.blocks.view({-1, t.block_bytes}).narrow(1, 0, 2).contiguous().view(torch::kHalf);
  if (!torch::isfinite(scales).all().item<bool>())
    throw FormatError(source + ": tensor '" + key + "' has non-finite block scales (NaN/Inf)");
}

// A layer whose weight can be kept in ggml blocks: an nn::Linear, or an nn::Conv2d whose weight
// is kept as an [out, in / groups * kh * kw] matrix.
struct BlockLayer {
  nn::LinearImpl* lin = nullptr;
  nn::Conv2dImpl* conv = nullptr;
  explicit BlockLayer(torch::nn::Module* m)
      : lin(dynamic_cast<nn::LinearImpl*>(m)),
        conv(lin ? nullptr : dynamic_cast<nn::Conv2dImpl*>(m)) {}
  explicit operator bool() const { return lin || conv; }
  bool quantized() const { return lin ? lin->quantized != nullptr : conv->quantized != nullptr; }
  const torch::Tensor& weight() const { return lin ? lin->weight : conv->weight; }
  void keep(quant::QuantizedWeight q) {
    if (lin)
      lin->keep_quantized(std::move(q));
    else
      conv->keep_quantized(std::move(q));
  }
};

void check_weight_shape(c10::IntArrayRef stored, const torch::Tensor& w, const std::string& source,
                        const std::string& key) {
  if (stored != w.sizes())
    throw FormatError(source + ": tensor '" + key + "' has shape " + c10::str(stored) +
                      ", the model expects " + c10::str(w.sizes()));
}

// The layer's weight quantized to `type` on `device` from the file's `values` (of the layer's
// shape), their mapped pages given back; nullopt when its rows are not whole blocks. FormatError
// naming the tensor for a value that is not finite.
std::optional<quant::QuantizedWeight> quantize_file_values(
    const BlockLayer& layer, const torch::Tensor& values, quant::GgmlType type,
    const torch::Device& device, const std::string& source, const std::string& key) {
  const auto& w = layer.weight();
  if (w.dim() < 2) return std::nullopt;
  const int64_t rows = w.size(0), cols = w.numel() / rows;
  if (!quant::can_keep_quantized(type, cols)) return std::nullopt;
  check_weight_shape(values.sizes(), w, source, key);
  try {
    // Quantized where the values are (the quantizers work on the CPU), then moved.
    auto q = quant::quantize_weight(values.reshape({rows, cols}), type, key);
    io::release_mapped_pages(values);
    if (q.blocks.device() != device) {
      q.blocks = q.blocks.to(device);
      if (q.row_scales.defined()) q.row_scales = q.row_scales.to(device);
    }
    return q;
  } catch (const NumericalError&) {
    throw FormatError(source + ": tensor '" + key + "' has non-finite values (NaN/Inf)");
  }
}

}  // namespace

void load_component_weights(torch::nn::Module& module, const io::ModelFolder& folder,
                            const std::string& component, const std::set<std::string>& ignored,
                            bool share_mapped) {
  const std::string source = folder.component_dir(component);
  refuse_unexpected(nn::load_state_dict(module, folder.component_weights(component), source,
                                        ignored, share_mapped),
                    source);
}

bool component_is_gguf(const io::ModelFolder& folder, const std::string& component) {
  return io::ends_with(folder.component_weights_path(component), ".gguf");
}

int64_t component_weight_bytes(const io::ModelFolder& folder, const std::string& component) {
  if (component_is_gguf(folder, component)) {
    // Its table read against the file's size: one cut short fails here, at the plan, and not
    // when the transformer loads after the text encoders have run.
    const auto path = folder.component_weights_path(component);
    io::GgufFile::open(path);
    return static_cast<int64_t>(std::filesystem::file_size(path));
  }
  int64_t bytes = 0;
  for (const auto& [name, t] : folder.component_weights(component))
    bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

std::shared_ptr<BlockWeightStream> load_component_streamed(
    torch::nn::Module& module, const io::ModelFolder& folder, const std::string& component,
    const std::vector<std::string>& block_prefixes, torch::Device device, torch::Dtype dtype) {
  const std::string where = folder.dir() + " (" + component + ")";
  if (component_is_gguf(folder, component))
    throw InvalidArgument("weight streaming reads plain weights from safetensors files; " + where +
                          " is a GGUF file (quantized: it loads whole)");
  const auto& file = folder.component_weights(component);
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (!file.count(p.key()))
      throw InvalidArgument(
          "weight streaming views the weights where the files hold them, by "
          "the module's names; " +
          where + " has no '" + p.key() +
          "' (a checkpoint in another key layout loads whole: streaming off)");
  // The block parameters view the files; everything else is converted and placed now.
  load_component_weights(module, folder, component, {}, /*share_mapped=*/true);
  auto stream = std::make_shared<BlockWeightStream>(module, block_prefixes, device, dtype);
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    bool in_block = false;
    for (const auto& prefix : block_prefixes)
      in_block = in_block || p.key().compare(0, prefix.size(), prefix) == 0;
    if (!in_block) p.value().set_data(p.value().to(device, dtype, false, /*copy=*/true));
  }
  for (auto& b : module.buffers(/*recurse=*/true)) b.set_data(b.to(device));
  return stream;
}

nn::QuantizedLayers load_component_weights_quantized(torch::nn::Module& module,
                                                     const io::ModelFolder& folder,
                                                     const std::string& component,
                                                     std::optional<quant::GgmlType> type,
                                                     const torch::Device& device,
                                                     const WeightLayoutFor& layout_for) {
  return load_weights_file_quantized(module, folder.component_weights_path(component), type, device,
                                     layout_for);
}

nn::QuantizedLayers load_weights_file_quantized(torch::nn::Module& module,
                                                const std::string& source,
                                                std::optional<quant::GgmlType> type,
                                                const torch::Device& device,
                                                const WeightLayoutFor& layout_for,
                                                const std::string& file_prefix) {
  std::shared_ptr<io::GgufFile> gguf;
  std::map<std::string, torch::Tensor> mapped;  // safetensors: views of the mapped file
  if (io::is_gguf_file(source))                 // by its magic: a file's name says nothing certain
    gguf = io::GgufFile::open(source);
  else
    mapped = io::load_weights_file(source);
  auto has = [&](const std::string& key) {
    return gguf ? gguf->contains(key) : mapped.count(key) > 0;
  };
  std::vector<std::string> file_keys;  // the module's part of the file
  if (gguf) {
    for (const auto& name : gguf->names())
      if (io::starts_with(name, file_prefix)) file_keys.push_back(name);
  } else {
    for (const auto& item : mapped)
      if (io::starts_with(item.first, file_prefix)) file_keys.push_back(item.first);
  }
  const auto layout = layout_for ? layout_for(file_keys) : std::nullopt;
  // Where a parameter's values are in the file: under its own name, or through the layout.
  auto slice_of = [&](const std::string& key) -> std::optional<io::WeightSlice> {
    if (!layout)
      return has(key) ? std::optional<io::WeightSlice>(io::WeightSlice{key}) : std::nullopt;
    const auto it = layout->find(key);
    if (it == layout->end() || !has(it->second.key)) return std::nullopt;
    return it->second;
  };

  torch::NoGradGuard no_grad;
  nn::QuantizedLayers report;
  std::set<std::string> kept;  // weights loaded as blocks
  for (const auto& item : module.named_modules()) {
    BlockLayer layer(item.value().get());
    if (!layer) continue;
    const std::string key = (item.key().empty() ? "" : item.key() + ".") + "weight";
    const auto slice = slice_of(key);
    if (!slice) continue;  // load_state_dict names what is missing
    const auto& w = layer.weight();
    std::optional<quant::QuantizedWeight> q;
    const std::string& file_key = slice->key;
    const bool stored_in_blocks =
        gguf && quant::ggml_type_traits(gguf->info(file_key).type).quantized;
    // A GGUF's quantized matrices as stored (ggml blocks run along a tensor's last dimension, so
    // a convolution's 4-d weight is never stored in blocks).
    if (layer.lin && stored_in_blocks) {
      const auto& info = gguf->info(file_key);
      const int64_t rows = w.size(0), cols = w.size(1);
      if (info.shape.size() != 2 || info.shape[1] != cols || info.shape[0] <= 0)
        check_weight_shape(info.shape, w, source, key);
      if (device.is_cpu() || quant::dequantizes_on_device(info.type)) {
        // Rows of ggml blocks are independent: a slice of rows is a slice of the bytes.
        const int64_t file_rows = info.shape[0];
        auto bytes = torch::from_blob(const_cast<uint8_t*>(gguf->data(file_key)),
                                      {file_rows, static_cast<int64_t>(info.bytes) / file_rows},
                                      torch::kByte);
        bytes = io::take_slice(bytes, *slice, source);
        if (bytes.size(0) != rows) check_weight_shape({bytes.size(0), cols}, w, source, key);
        bytes = bytes.reshape({-1});
        bytes = bytes.to(device, /*non_blocking=*/false, /*copy=*/true);
        gguf->release_pages(file_key);  // copied: not held twice
        q = quant::quantized_from_blocks(bytes, info.type, rows, cols, source + ": " + file_key);
        check_block_scales(*q, source, file_key);
      }
    }
    if (!q && type && !stored_in_blocks) {
      q = quantize_file_values(
          layer,
          io::take_slice(gguf ? gguf->read_only_view(file_key) : mapped.at(file_key), *slice,
                         source),
          *type, device, source, key);
      if (gguf) gguf->release_pages(file_key);
    }
    if (!q) {
      if (gguf || type) ++report.kept_plain;
      continue;
    }
    report.plain_bytes += w.numel() * static_cast<int64_t>(w.element_size());
    report.quantized_bytes += q->bytes();
    layer.keep(std::move(*q));
    kept.insert(key);
    ++report.layers;
  }

  // Everything else, as load_component_weights loads it.
  std::map<std::string, torch::Tensor> rest;
  // Views of the mapped files: load_state_dict copies them into the parameters, and the pages
  // go back to the OS afterwards.
  auto get = [&](const std::string& name) {
    return gguf ? gguf->read_only_view(name) : mapped.at(name);
  };
  if (layout) {
    std::set<std::string> read;  // file tensors some parameter reads
    for (const auto& [name, slice] : *layout) {
      read.insert(slice.key);
      if (!kept.count(name) && has(slice.key))
        rest.emplace(name, io::take_slice(get(slice.key), slice, source));
    }
    for (const auto& name : file_keys)
      if (!read.count(name)) rest.emplace(name, get(name));  // named as unexpected below
  } else {
    for (const auto& name : file_keys)
      if (!kept.count(name)) rest.emplace(name, get(name));
  }
  std::function<void(const torch::Tensor&)> copied;
  if (gguf) copied = [&gguf](const torch::Tensor& view) { gguf->release_pages(view); };
  refuse_unexpected(nn::load_state_dict(module, rest, source, kept, false, {}, copied), source);
  if (gguf) gguf->release_pages();
  return report;
}

std::set<std::string> quantize_layers_from_weights(
    torch::nn::Module& module, const std::map<std::string, torch::Tensor>& weights,
    quant::GgmlType type, const torch::Device& device, const std::string& source) {
  torch::NoGradGuard no_grad;
  std::set<std::string> kept;
  for (const auto& item : module.named_modules()) {
    BlockLayer layer(item.value().get());
    if (!layer || layer.quantized()) continue;
    const std::string key = (item.key().empty() ? "" : item.key() + ".") + "weight";
    const auto it = weights.find(key);
    if (it == weights.end()) continue;  // named by load_state_dict
    auto q = quantize_file_values(layer, it->second, type, device, source, key);
    if (!q) continue;
    layer.keep(std::move(*q));
    kept.insert(key);
  }
  return kept;
}

void load_component_weights_to(torch::nn::Module& module, const io::ModelFolder& folder,
                               const std::string& component, std::optional<quant::GgmlType> type,
                               const torch::Device& device, torch::Dtype dtype,
                               nn::QuantizedLayers* quantized, const WeightLayoutFor& layout_for) {
  if (type || layout_for || component_is_gguf(folder, component)) {
    const auto kept =
        load_component_weights_quantized(module, folder, component, type, device, layout_for);
    if (quantized) *quantized = kept;
  } else {
    load_component_weights(module, folder, component);
  }
  // Quantized layers' placeholders are on the device already: not copied.
  module.to(device, dtype);
}

}  // namespace diffuse::models
