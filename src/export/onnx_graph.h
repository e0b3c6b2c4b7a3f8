// Builds one ONNX graph node by node from the engine's modules (src/export/onnx_modules.h) and
// writes it: weights inside the file, or as external data beside it once they pass what one
// protobuf message may hold (2 GiB), both files written under temporary names and renamed.
// Values are named by strings, as in ONNX itself. Every op the graph uses is checked against
// the opset it is written for, so a too-low --opset fails naming the op before anything is
// written.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace onnx {
class ModelProto;
class NodeProto;
}  // namespace onnx

namespace diffuse::onnx_export {

// ONNX opsets this exporter writes: 13 (Split/Unsqueeze/ReduceSum take their axes as inputs)
// up to the 17 that Debian's ONNX library checks (LayerNormalization is native from 17,
// written out in primitive ops below it).
constexpr int kMinOpset = 13;
constexpr int kMaxOpset = 17;

using Value = std::string;

// One attribute value: int, float, ints, floats or string.
using AttrValue =
    std::variant<int64_t, double, std::vector<int64_t>, std::vector<double>, std::string>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

// A graph input's dimension: fixed, or symbolic ("batch").
using Dim = std::variant<int64_t, std::string>;

class OnnxGraph {
 public:
  // `compute` is the dtype activations and weights are written in (float32 or float16).
  OnnxGraph(int opset, torch::Dtype compute, std::string graph_name);
  ~OnnxGraph();
  OnnxGraph(const OnnxGraph&) = delete;
  OnnxGraph& operator=(const OnnxGraph&) = delete;

  int opset() const { return opset_; }
  torch::Dtype compute_dtype() const { return compute_; }

  Value input(const std::string& name, torch::Dtype dtype, const std::vector<Dim>& dims);
  // Names `value` as the graph output `name` (an Identity node when the value has another name).
  void output(const std::string& name, const Value& value, torch::Dtype dtype,
              const std::vector<Dim>& dims);

  // A weight under `name`: floating tensors in the compute dtype, others as they are. The data
  // is written at save(); the tensor is held until then.
  Value weight(const std::string& name, const torch::Tensor& tensor);
  // Small constants (initializers named after `hint`).
  Value ints(const std::vector<int64_t>& values, const std::string& hint = "const");
  Value scalar(double value, const std::string& hint = "const");  // compute dtype, shape []
  Value scalar_f32(double value, const std::string& hint = "const");
  Value scalar_int(int64_t value, const std::string& hint = "const");  // int64, shape []
  Value tensor_const(const torch::Tensor& t, const std::string& hint = "const");

  // A node with one output; `type` must exist at this opset (see op_since).
  Value op(const std::string& type, const std::vector<Value>& inputs, const Attrs& attrs = {},
           const std::string& hint = "");
  std::vector<Value> op_n(const std::string& type, const std::vector<Value>& inputs, int outputs,
                          const Attrs& attrs = {}, const std::string& hint = "");

  // The dims `indices` of `x`'s shape, as a 1-D int64 value (Shape + Gather): sizes that a
  // --dynamic graph only knows at run time, folded to constants by runtimes otherwise.
  Value dims_of(const Value& x, const std::vector<int64_t>& indices);
  Value concat_ints(const std::vector<Value>& parts);
  Value cast(const Value& x, torch::Dtype to);

  // Prefix for node names ("down_blocks.0.resnets.1"): a runtime's profile then reads like
  // the module tree.
  void set_scope(const std::string& scope) { scope_ = scope; }
  const std::string& scope() const { return scope_; }

  // The ops used and their counts (docs/ascend.md lists them per component).
  const std::map<std::string, int64_t>& op_counts() const { return op_counts_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  bool has_weight(const std::string& name) const { return weight_index_.count(name) > 0; }

  struct SaveOptions {
    // Weights go to `<path>.data` when they would pass this (protobuf's 2 GiB, less room for the
    // graph), or always when `external_data` is set.
    int64_t inline_limit_bytes = (int64_t{2} << 30) - (int64_t{64} << 20);
    bool external_data = false;
  };
  struct Saved {
    std::string model_path, data_path;  // data_path empty when the weights are inside
    int64_t model_bytes = 0, data_bytes = 0;
  };
  // Checks the model with ONNX's checker, then writes it. IoError on a write failure (nothing
  // is left behind), Error when the checker refuses the graph (a bug here: it names the node).
  Saved save(const std::string& path, const SaveOptions& options);

 private:
  std::string node_name(const std::string& type);
  std::string fresh(const std::string& hint);

  int opset_;
  torch::Dtype compute_;
  std::unique_ptr<onnx::ModelProto> model_;
  std::string scope_;
  int64_t counter_ = 0;
  std::map<std::string, int64_t> op_counts_;
  struct PendingWeight {
    std::string name;
    torch::Tensor tensor;  // contiguous, in the dtype it is written in
  };
  std::vector<PendingWeight> weights_;
  std::map<std::string, size_t> weight_index_;
  int64_t weight_bytes_ = 0;
};

// The first opset that has `type` in the form this exporter writes, or 0 when it is unknown.
int op_since(const std::string& type);

}  // namespace diffuse::onnx_export
