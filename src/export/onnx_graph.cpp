#include "export/onnx_graph.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"
#include "export/onnx_proto.h"
#include "io/atomic_file.h"

namespace diffuse::onnx_export {
namespace {

int32_t onnx_type(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return onnx::TensorProto_DataType_FLOAT;
    case torch::kFloat16:
      return onnx::TensorProto_DataType_FLOAT16;
    case torch::kBFloat16:
      return onnx::TensorProto_DataType_BFLOAT16;
    case torch::kFloat64:
      return onnx::TensorProto_DataType_DOUBLE;
    case torch::kInt64:
      return onnx::TensorProto_DataType_INT64;
    case torch::kInt32:
      return onnx::TensorProto_DataType_INT32;
    case torch::kInt8:
      return onnx::TensorProto_DataType_INT8;
    case torch::kUInt8:
      return onnx::TensorProto_DataType_UINT8;
    case torch::kBool:
      return onnx::TensorProto_DataType_BOOL;
    default:
      throw InvalidArgument(std::string("ONNX export: no ONNX type for ") + c10::toString(dtype));
  }
}

void set_attr(onnx::AttributeProto& a, const AttrValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    a.set_type(onnx::AttributeProto_AttributeType_INT);
    a.set_i(*i);
  } else if (const auto* f = std::get_if<double>(&v)) {
    a.set_type(onnx::AttributeProto_AttributeType_FLOAT);
    a.set_f(static_cast<float>(*f));
  } else if (const auto* is = std::get_if<std::vector<int64_t>>(&v)) {
    a.set_type(onnx::AttributeProto_AttributeType_INTS);
    for (auto x : *is) a.add_ints(x);
  } else if (const auto* fs = std::get_if<std::vector<double>>(&v)) {
    a.set_type(onnx::AttributeProto_AttributeType_FLOATS);
    for (auto x : *fs) a.add_floats(static_cast<float>(x));
  } else {
    a.set_type(onnx::AttributeProto_AttributeType_STRING);
    a.set_s(std::get<std::string>(v));
  }
}

void set_value_info(onnx::ValueInfoProto& info, const std::string& name, torch::Dtype dtype,
                    const std::vector<Dim>& dims) {
  info.set_name(name);
  auto* tensor = info.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx_type(dtype));
  auto* shape = tensor->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (const auto* n = std::get_if<int64_t>(&d))
      dim->set_dim_value(*n);
    else
      dim->set_dim_param(std::get<std::string>(d));
  }
}

void fill_tensor_header(onnx::TensorProto& t, const std::string& name, const torch::Tensor& x) {
  t.set_name(name);
  t.set_data_type(onnx_type(x.scalar_type()));
  for (auto d : x.sizes()) t.add_dims(d);
}

std::string tensor_bytes(const torch::Tensor& x) {
  return std::string(static_cast<const char*>(x.data_ptr()), x.numel() * x.element_size());
}

constexpr int64_t kInlineBytes = 1024;

// Removes a file on scope exit unless released (the data file of a save that failed later).
struct RemoveOnFailure {
  std::string path;
  ~RemoveOnFailure() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

}  // namespace

int op_since(const std::string& type) {
  // The opset at which each op took the form written here (ONNX's Operators.md).
  static const std::map<std::string, int> since = {
      {"Add", 7},
      {"Sub", 7},
      {"Mul", 7},
      {"Div", 7},
      {"Pow", 7},
      {"Sqrt", 6},
      {"Erf", 9},
      {"Tanh", 6},
      {"Sigmoid", 6},
      {"Relu", 6},
      {"Softplus", 1},
      {"Sin", 7},
      {"Cos", 7},
      {"Exp", 6},
      {"MatMul", 9},
      {"Conv", 11},
      {"Softmax", 13},
      {"Transpose", 1},
      {"Reshape", 5},
      {"Concat", 11},
      {"Gather", 11},
      {"Shape", 1},
      {"Cast", 6},
      {"Unsqueeze", 13},
      {"Squeeze", 13},
      {"Slice", 10},
      {"Split", 13},
      {"Resize", 13},
      {"AveragePool", 11},
      {"Identity", 1},
      {"ArgMax", 13},
      {"Equal", 11},
      {"Range", 11},
      {"ReduceMean", 1},
      {"InstanceNormalization", 6},
      {"LayerNormalization", 17},
      {"Pad", 13},
      {"Clip", 13},
      {"Neg", 6},
      {"TopK", 11},
      {"ScatterElements", 11},
      // T5's position buckets, Llama's masks and grouped heads.
      {"Greater", 9},
      {"Less", 9},
      {"Abs", 6},
      {"Log", 6},
      {"Where", 9},
      {"Max", 12},
      {"Min", 12},
      {"Expand", 8},
  };
  const auto it = since.find(type);
  return it == since.end() ? 0 : it->second;
}

OnnxGraph::OnnxGraph(int opset, torch::Dtype compute, std::string graph_name)
    : opset_(opset), compute_(compute), model_(std::make_unique<onnx::ModelProto>()) {
  if (opset < kMinOpset || opset > kMaxOpset)
    throw InvalidArgument("--opset " + std::to_string(opset) + ": diffuse writes opsets " +
                          std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset) +
                          " (13 is the first where Split, Unsqueeze and Squeeze take their axes "
                          "as inputs; 17 the newest Debian's ONNX checker knows)");
  if (compute != torch::kFloat32 && compute != torch::kFloat16)
    throw InvalidArgument(
        "ONNX export: weights and activations are written in float32 or "
        "float16, not " +
        std::string(c10::toString(compute)));
  model_->set_ir_version(8);  // ONNX 1.10-1.12's IR: what opsets 13-17 are read with
  model_->set_producer_name("diffuse");
  model_->set_producer_version(DIFFUSE_VERSION);
  auto* op = model_->add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  model_->mutable_graph()->set_name(std::move(graph_name));
}

OnnxGraph::~OnnxGraph() = default;

std::string OnnxGraph::fresh(const std::string& hint) {
  return (scope_.empty() ? "" : scope_ + "/") + hint + "_" + std::to_string(counter_++);
}

std::string OnnxGraph::node_name(const std::string& type) {
  return fresh(type);
}

Value OnnxGraph::input(const std::string& name, torch::Dtype dtype, const std::vector<Dim>& dims) {
  set_value_info(*model_->mutable_graph()->add_input(), name, dtype, dims);
  return name;
}

void OnnxGraph::output(const std::string& name, const Value& value, torch::Dtype dtype,
                       const std::vector<Dim>& dims) {
  if (value != name) {
    auto* node = model_->mutable_graph()->add_node();
    node->set_op_type("Identity");
    node->set_name(name + "/Identity");
    node->add_input(value);
    node->add_output(name);
    ++op_counts_["Identity"];
  }
  set_value_info(*model_->mutable_graph()->add_output(), name, dtype, dims);
}

Value OnnxGraph::weight(const std::string& name, const torch::Tensor& tensor) {
  if (const auto it = weight_index_.find(name); it != weight_index_.end()) {
    if (!weights_[it->second].tensor.sizes().equals(tensor.sizes()))
      throw Error("ONNX export: weight " + name + " given twice with different shapes");
    return name;
  }
  torch::NoGradGuard no_grad;
  auto t = tensor.detach().to(torch::kCPU);
  if (t.is_floating_point()) t = t.to(compute_);
  t = t.contiguous();
  weight_bytes_ += t.numel() * t.element_size();
  weight_index_[name] = weights_.size();
  weights_.push_back({name, t});
  return name;
}

Value OnnxGraph::tensor_const(const torch::Tensor& t, const std::string& hint) {
  const auto name = fresh(hint);
  auto c = t.detach().to(torch::kCPU).contiguous();
  weight_index_[name] = weights_.size();
  weights_.push_back({name, c});
  weight_bytes_ += c.numel() * c.element_size();
  return name;
}

Value OnnxGraph::scalar_int(int64_t value, const std::string& hint) {
  return tensor_const(torch::scalar_tensor(value, torch::kInt64), hint);
}

Value OnnxGraph::ints(const std::vector<int64_t>& values, const std::string& hint) {
  return tensor_const(torch::tensor(values, torch::kInt64), hint);
}

Value OnnxGraph::scalar(double value, const std::string& hint) {
  return tensor_const(torch::scalar_tensor(value, torch::kFloat64).to(compute_), hint);
}

Value OnnxGraph::scalar_f32(double value, const std::string& hint) {
  return tensor_const(torch::scalar_tensor(value, torch::kFloat32), hint);
}

std::vector<Value> OnnxGraph::op_n(const std::string& type, const std::vector<Value>& inputs,
                                   int outputs, const Attrs& attrs, const std::string& hint) {
  const int since = op_since(type);
  if (since == 0) throw Error("ONNX export: op " + type + " is not in the exporter's table");
  if (since > opset_)
    throw InvalidArgument("ONNX export: " + type + " (" + (scope_.empty() ? "graph" : scope_) +
                          ") needs opset " + std::to_string(since) + " or later; --opset " +
                          std::to_string(opset_) + " is too low");
  auto* node = model_->mutable_graph()->add_node();
  node->set_op_type(type);
  node->set_name(node_name(type));
  for (const auto& in : inputs) node->add_input(in);
  std::vector<Value> outs;
  for (int i = 0; i < outputs; ++i) {
    outs.push_back(fresh(hint.empty() ? type : hint));
    node->add_output(outs.back());
  }
  for (const auto& [key, value] : attrs) {
    auto* a = node->add_attribute();
    a->set_name(key);
    set_attr(*a, value);
  }
  ++op_counts_[type];
  return outs;
}

Value OnnxGraph::op(const std::string& type, const std::vector<Value>& inputs, const Attrs& attrs,
                    const std::string& hint) {
  return op_n(type, inputs, 1, attrs, hint)[0];
}

Value OnnxGraph::dims_of(const Value& x, const std::vector<int64_t>& indices) {
  return op("Gather", {op("Shape", {x}), ints(indices, "dims")}, {{"axis", int64_t{0}}});
}

Value OnnxGraph::concat_ints(const std::vector<Value>& parts) {
  return parts.size() == 1 ? parts[0] : op("Concat", parts, {{"axis", int64_t{0}}});
}

Value OnnxGraph::cast(const Value& x, torch::Dtype to) {
  return op("Cast", {x}, {{"to", int64_t{onnx_type(to)}}});
}

OnnxGraph::Saved OnnxGraph::save(const std::string& path, const SaveOptions& options) {
  auto* graph = model_->mutable_graph();
  graph->clear_initializer();
  // The checker reads node types, attributes, names and the graph's wiring, not the weights'
  // bytes: it runs before anything is written, on initializers holding one element each.
  for (const auto& w : weights_) {
    auto* t = graph->add_initializer();
    fill_tensor_header(*t, w.name, w.tensor);
    t->set_raw_data(std::string(w.tensor.element_size(), '\0'));
  }
  try {
    onnx::checker::check_model(*model_);
  } catch (const std::exception& e) {
    throw Error("ONNX export: ONNX's checker refused the graph: " + std::string(e.what()));
  }

  Saved saved;
  saved.model_path = path;
  const bool external = options.external_data || weight_bytes_ > options.inline_limit_bytes;
  io::check_output_path(path, "ONNX output");
  RemoveOnFailure cleanup_data;
  if (external) {
    saved.data_path = path + ".data";
    io::check_output_path(saved.data_path, "ONNX external data");
    const std::string location = std::filesystem::path(saved.data_path).filename().string();
    io::AtomicFile data(saved.data_path);
    {
      std::ofstream out(data.temp_path(), std::ios::binary);
      int64_t offset = 0;
      for (int i = 0; i < graph->initializer_size(); ++i) {
        const auto& w = weights_[i];
        const int64_t bytes = w.tensor.numel() * w.tensor.element_size();
        // Small tensors (axes, shapes, scalars) stay inline, as ONNX's own external-data
        // conversion keeps them: runtimes read them during shape inference.
        if (bytes < kInlineBytes) {
          graph->mutable_initializer(i)->set_raw_data(tensor_bytes(w.tensor));
          continue;
        }
        // 64-byte aligned, so that a runtime may map the weights in place.
        const int64_t pad = (64 - offset % 64) % 64;
        if (pad) out.write(std::string(pad, '\0').data(), pad);
        offset += pad;
        out.write(static_cast<const char*>(w.tensor.data_ptr()), bytes);
        auto* t = graph->mutable_initializer(i);
        t->clear_raw_data();
        t->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
        auto add = [&](const std::string& k, const std::string& v) {
          auto* e = t->add_external_data();
          e->set_key(k);
          e->set_value(v);
        };
        add("location", location);
        add("offset", std::to_string(offset));
        add("length", std::to_string(bytes));
        offset += bytes;
      }
      out.flush();
      if (!out) throw IoError("ONNX export: writing " + saved.data_path + " failed");
      saved.data_bytes = offset;
    }
    data.commit();
    cleanup_data.path = saved.data_path;
  } else {
    for (int i = 0; i < graph->initializer_size(); ++i)
      graph->mutable_initializer(i)->set_raw_data(tensor_bytes(weights_[i].tensor));
  }
  io::write_file_atomically(path, [&](std::ostream& out) {
    if (!model_->SerializeToOstream(&out))
      throw IoError("ONNX export: serialising the model to " + path + " failed");
  });
  cleanup_data.path.clear();
  saved.model_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  graph->clear_initializer();  // the bytes were copied in; free them
  return saved;
}

}  // namespace diffuse::onnx_export
