#include "quant/quantize_model.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <vector>

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/model_folder.h"
#include "io/string_affixes.h"
#include "quant/ggml_blocks.h"

namespace fs = std::filesystem;

namespace diffuse::quant {
namespace {

GgmlType plain_type_of(torch::Dtype dtype) {
  if (dtype == torch::kFloat16) return GgmlType::F16;
  if (dtype == torch::kBFloat16) return GgmlType::BF16;
  return GgmlType::F32;
}

}  // namespace

GgmlType gguf_storage_type(c10::ScalarType dtype, bool floating, const std::vector<int64_t>& shape,
                           GgmlType type) {
  const auto& traits = ggml_type_traits(type);
  if (!floating) return GgmlType::F32;
  if (!traits.quantized) return type;
  if (shape.size() >= 2 && shape.back() % traits.block_elems == 0) return type;
  return plain_type_of(dtype);
}

QuantizeReport quantize_model(const QuantizeOptions& o) {
  const auto type = ggml_type_named(o.type);
  if (!type || !can_quantize(*type))
    throw InvalidArgument("quantize: --type '" + o.type +
                          "' cannot be written (q8_0, q4_0, f16, bf16 or f32)");
  if (!io::ends_with(o.out, ".gguf"))
    throw InvalidArgument("quantize: the output '" + o.out + "' must be a .gguf file");
  io::check_output_path(o.out, "quantize output");
  if (!fs::exists(o.model)) throw IoError("quantize: model '" + o.model + "' does not exist");

  QuantizeReport report;
  std::map<std::string, torch::Tensor> weights;
  std::string architecture;
  if (fs::is_directory(o.model)) {
    const auto folder = io::ModelFolder::open(o.model);
    report.component = !o.component.empty()                  ? o.component
                       : folder.has_component("transformer") ? "transformer"
                                                             : "unet";
    weights = folder.component_weights(report.component);
    architecture = folder.component_class(report.component);
  } else {
    if (!o.component.empty())
      throw InvalidArgument("quantize: --component applies to a model folder, not to the file '" +
                            o.model + "'");
    weights = io::load_weights_file(o.model);
    architecture = "single-file checkpoint";
  }
  const auto& traits = ggml_type_traits(*type);
  std::vector<io::GgufTensorToWrite> tensors;
  for (const auto& [name, t] : weights) {
    report.bytes_in += static_cast<int64_t>(t.nbytes());
    io::GgufTensorToWrite w{
        name, t, gguf_storage_type(t.scalar_type(), t.is_floating_point(), t.sizes().vec(), *type)};
    report.quantized += traits.quantized && w.type == *type ? 1 : 0;
    tensors.push_back(std::move(w));
  }
  report.tensors = static_cast<int>(tensors.size());
  io::write_gguf(o.out,
                 {{"general.architecture", architecture},
                  {"general.name", fs::path(o.model).filename().string()},
                  {"diffuse.quantized_from", o.model},
                  {"diffuse.type", traits.name}},
                 tensors);
  report.bytes_out = static_cast<int64_t>(fs::file_size(o.out));
  return report;
}

}  // namespace diffuse::quant
