#include "io/unet_file.h"

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/input_file.h"
#include "io/ldm_checkpoint.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"

namespace diffuse::io {
namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

std::map<std::string, std::vector<int64_t>> weight_file_shapes(const std::string& path) {
  std::map<std::string, std::vector<int64_t>> shapes;
  if (is_gguf_file(path)) {
    auto file = GgufFile::open(path);
    for (const auto& name : file->names()) shapes[name] = file->info(name).shape;
  } else {
    auto file = SafetensorsFile::open(path);
    for (const auto& name : file->names()) shapes[name] = file->info(name).shape;
  }
  return shapes;
}

namespace {

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// The table of an LDM UNet whose tensors are `shapes`' keys starting with `prefix` (the others
// are the caller's to judge): built from names and shapes alone, as the LDM parser reads
// structure from nothing else.
UnetFile ldm_unet_file(const std::string& path,
                       const std::map<std::string, std::vector<int64_t>>& shapes,
                       const std::string& prefix) {
  UnetFile out;
  out.path = path;
  out.naming = "ldm";
  out.prefix = prefix;
  ldm::TensorMap pool;
  for (const auto& [name, shape] : shapes)
    if (starts_with(name, prefix))
      pool[name.substr(prefix.size())] =
          at::empty(shape, at::TensorOptions().device(c10::DeviceType::Meta));
  out.ldm = ldm::parse_unet_layout(pool, path);
  std::map<std::string, std::string> sources;
  const auto mapped = ldm::map_unet(pool, *out.ldm, path, &sources);
  if (!pool.empty()) {
    std::vector<std::string> left;
    for (const auto& item : pool) left.push_back(prefix + item.first);
    throw FormatError(path + ": tensors no rule of the LDM UNet layout reads: " + listed(left));
  }
  out.layout.emplace();
  for (const auto& [name, key] : sources) {
    (*out.layout)[name] = WeightSlice{prefix + key};
    out.parameters += mapped.at(name).numel();
  }
  return out;
}

}  // namespace

UnetFile open_unet_file(const std::string& path) {
  require_regular_file(path, "UNet file");
  const auto shapes = weight_file_shapes(path);
  if (shapes.count("conv_in.weight")) {
    UnetFile out;
    out.path = path;
    out.naming = "diffusers";
    for (const auto& [name, shape] : shapes) out.parameters += elements(shape);
    return out;
  }
  const bool prefixed = shapes.count(ldm::kUnetPrefix + "input_blocks.0.0.weight") != 0;
  if (!prefixed && !shapes.count("input_blocks.0.0.weight"))
    throw FormatError(path +
                      ": not a UNet file: expected diffusers names (conv_in.weight, "
                      "down_blocks.*) or the original LDM names (input_blocks.0.0.weight, "
                      "middle_block.*, output_blocks.*, optionally under '" +
                      ldm::kUnetPrefix + "')");
  const std::string prefix = prefixed ? ldm::kUnetPrefix : "";
  std::vector<std::string> foreign;
  for (const auto& [name, shape] : shapes)
    if (!starts_with(name, prefix)) foreign.push_back(name);
  if (!foreign.empty())
    throw FormatError(path + ": holds tensors outside the UNet (" + listed(foreign) +
                      "); a whole checkpoint loads with --model FILE, not --unet");
  return ldm_unet_file(path, shapes, prefix);
}

UnetFile unet_in_checkpoint(const std::string& path) {
  return ldm_unet_file(path, weight_file_shapes(path), ldm::kUnetPrefix);
}

void check_unet_file_against_config(const UnetFile& file, const nlohmann::json& config,
                                    const std::string& config_source) {
  if (!file.ldm) return;
  std::vector<std::string> assumed;
  // The family only picks values shapes cannot determine, which are not compared.
  const auto inferred = ldm::infer_unet_config(
      *file.ldm, file.ldm->use_linear_projection ? "sd2" : "sd1", false, &assumed);
  // transformer_layers_per_block is left out: the inference gives levels without attention the
  // middle block's depth, which a config may write differently (SDXL's [1, 2, 10]).
  static const std::vector<std::string> keys = {
      "in_channels",      "out_channels",   "block_out_channels",  "layers_per_block",
      "down_block_types", "up_block_types", "cross_attention_dim", "use_linear_projection"};
  ldm::check_config_against_weights(config, inferred, keys, config_source, file.path);
}

}  // namespace diffuse::io
