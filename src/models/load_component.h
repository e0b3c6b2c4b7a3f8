// Shared steps of loading one component of a diffusers folder into a module.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/weight_layout.h"
#include "models/block_streaming.h"
#include "nn/layers.h"

namespace diffuse::models {

// Given the file's tensor names, the layout to read it with (io/weight_layout.h), or nullopt
// for the module's own names.
using WeightLayoutFor =
    std::function<std::optional<io::WeightLayout>(const std::vector<std::string>& file_keys)>;

// `<component>/config.json`; ConfigError if its _class_name is present and not `expected_class`.
io::JsonConfig component_config(const io::ModelFolder& folder, const std::string& component,
                                const std::string& expected_class);

// Loads the component's weights into `module` by name. FormatError naming the folder if a
// parameter is missing or mis-shaped, or if the file has tensors the module does not know
// (a config that does not match its weights would otherwise run with pieces left out).
// `ignored`: keys the file may hold that the module deliberately lacks (tied aliases, an
// unused lm_head).
// `share_mapped`: parameters view the mapped files instead of copies (nn::load_state_dict).
void load_component_weights(torch::nn::Module& module, const io::ModelFolder& folder,
                            const std::string& component, const std::set<std::string>& ignored = {},
                            bool share_mapped = false);

// load_component_weights with the linear and convolution layers' weights kept in ggml blocks
// straight from the file, so that the plain weights are never all in memory (the module must
// have been built under nn::SkipInitGuard::Weights::kDeferred: its untouched weights take no
// memory until loaded): a GGUF file's quantized matrices as stored, and with `type` every other
// such weight whose rows are whole blocks (a convolution's as an [out, in / groups * kh * kw]
// matrix) quantized from the file's values one at a time. Blocks and placeholders go to
// `device`; the rest loads as load_component_weights does (call module->to(device, dtype)
// afterwards). A GGUF block type that `device` cannot dequantize (k-quants off the CPU) is
// dequantized at load instead. Returns what was kept quantized.
// With `layout_for`, a file in another key layout is read through its slices.
nn::QuantizedLayers load_component_weights_quantized(torch::nn::Module& module,
                                                     const io::ModelFolder& folder,
                                                     const std::string& component,
                                                     std::optional<quant::GgmlType> type,
                                                     const torch::Device& device,
                                                     const WeightLayoutFor& layout_for = {});

// load_component_weights_quantized on one weights file (.safetensors or .gguf) at `path`, of
// which only the tensors named with `file_prefix` are the module's (a checkpoint's UNet).
nn::QuantizedLayers load_weights_file_quantized(torch::nn::Module& module, const std::string& path,
                                                std::optional<quant::GgmlType> type,
                                                const torch::Device& device,
                                                const WeightLayoutFor& layout_for = {},
                                                const std::string& file_prefix = "");

// Keeps every nn::Linear and nn::Conv2d of `module` whose weight `weights` holds (with the
// module's shape) and whose rows are whole blocks of `type` in ggml blocks on `device`,
// quantized straight from the file's values one layer at a time (a convolution's weight as an
// [out, in / groups * kh * kw] matrix), so that with the module built under
// nn::SkipInitGuard::Weights::kDeferred its plain weights never exist: a SD2.1 UNet loaded
// plain and quantized afterwards peaked 0.6 GiB above the plain run. Returns the names of the
// weights kept: load the others as usual, with these left out of the map and named in
// load_state_dict's `ignored`.
std::set<std::string> quantize_layers_from_weights(
    torch::nn::Module& module, const std::map<std::string, torch::Tensor>& weights,
    quant::GgmlType type, const torch::Device& device, const std::string& source);

// The component's weights into `module` (built under nn::SkipInitGuard), then the module onto
// `device` in `dtype`: kept in ggml blocks (load_component_weights_quantized, what was kept
// into `quantized`) with `type` or a GGUF file, else plain (load_component_weights). With
// `layout_for` the file may be in another key layout (see WeightLayoutFor).
void load_component_weights_to(torch::nn::Module& module, const io::ModelFolder& folder,
                               const std::string& component, std::optional<quant::GgmlType> type,
                               const torch::Device& device, torch::Dtype dtype,
                               nn::QuantizedLayers* quantized,
                               const WeightLayoutFor& layout_for = {});

// Whether the component's weights are a GGUF file.
bool component_is_gguf(const io::ModelFolder& folder, const std::string& component);

// The bytes of the component's weight files (a GGUF file's size; the safetensors' tensors).
int64_t component_weight_bytes(const io::ModelFolder& folder, const std::string& component);

// Loads the component for weight streaming (models/block_streaming.h): the parameters under
// `block_prefixes` (in run order) keep viewing their memory-mapped file tensors and come in
// block by block as the blocks run; every other parameter is placed on `device` in `dtype`
// now. InvalidArgument, before anything loads, when the weights are quantized (GGUF) or the
// files do not name every parameter as the module does (a checkpoint in another key layout,
// whose fused tensors cannot be viewed).
std::shared_ptr<BlockWeightStream> load_component_streamed(
    torch::nn::Module& module, const io::ModelFolder& folder, const std::string& component,
    const std::vector<std::string>& block_prefixes, torch::Device device, torch::Dtype dtype);

}  // namespace diffuse::models
