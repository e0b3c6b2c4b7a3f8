// The writers of each exportable component (onnx_export.h) and what they share: graph inputs
// and outputs recorded for the result, static or symbolic dimensions, the check that every
// parameter of a module went into the graph, the image size a request asks for.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "export/onnx_export.h"
#include "export/onnx_graph.h"

namespace diffuse::io {
class ModelFolder;
}

namespace diffuse::onnx_export {

constexpr int64_t kMaxPixels = 16384;
constexpr int64_t kMaxBatch = 256;

// The shape of a graph input or output: fixed sizes, or named symbols under --dynamic.
struct Shapes {
  bool dynamic;
  Dim dim(int64_t value, const std::string& symbol) const {
    return dynamic ? Dim(symbol) : Dim(value);
  }
};

TensorSpec spec(const std::string& name, torch::Dtype dtype, const std::vector<Dim>& dims);

// Graph inputs and outputs, recorded for the result as well.
struct Io {
  OnnxGraph& g;
  ExportResult& result;
  Value in(const std::string& name, torch::Dtype dtype, const std::vector<Dim>& dims) {
    result.inputs.push_back(spec(name, dtype, dims));
    return g.input(name, dtype, dims);
  }
  void out(const std::string& name, const Value& v, torch::Dtype dtype,
           const std::vector<Dim>& dims) {
    result.outputs.push_back(spec(name, dtype, dims));
    g.output(name, v, dtype, dims);
  }
};

// Every parameter of `module` (under `prefix`) went into the graph: a forgotten layer would
// otherwise export a model that runs and computes something else. Error naming the first.
void check_all_exported(const torch::nn::Module& module, const OnnxGraph& g,
                        const std::string& prefix, const std::string& what);

// The VAE's factor (8 without a VAE) and the image size a request asks for, defaulting to the
// UNet's sample_size times that factor, else 512; InvalidArgument for other sizes.
int64_t vae_factor(const io::ModelFolder& folder);
std::pair<int64_t, int64_t> image_size(const ExportRequest& r, const io::ModelFolder& folder,
                                       int64_t factor);

// Stable Diffusion 1.x/2.x/XL (onnx_sd_components.cpp).
void write_unet(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                ExportResult& result);
void write_vae(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
               ExportResult& result, bool decoder);
// A pipeline folder's ControlNetModel (controlnet/), configured with the folder's UNet.
void write_controlnet(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                      ExportResult& result);
void write_text_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                        ExportResult& result);
// T5EncoderModel (FLUX.1's text_encoder_2, HiDream's text_encoder_3; onnx_t5_encoder.cpp):
// fp32 only.
void write_t5_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                      ExportResult& result);
// LlamaForCausalLM as HiDream's text encoder (onnx_llama_encoder.cpp): every hidden state.
void write_llama_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                         ExportResult& result);
// FLUX.1 and Kontext (onnx_flux_transformer.cpp).
void write_flux_transformer(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                            ExportResult& result);
// HiDream-I1/E1 (onnx_hidream_transformer.cpp): static shapes only.
void write_hidream_transformer(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                               ExportResult& result);

}  // namespace diffuse::onnx_export
