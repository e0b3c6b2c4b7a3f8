// GGUF files (ggml's format; versions 2 and 3): the reader checks the whole header before any
// tensor is touched and never allocates more than the file's own size implies; the writer makes
// files ggml, stable-diffusion.cpp and ComfyUI-GGUF read.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count, metadata
// (string key, u32 value type, value), tensor infos (string name, u32 n_dims, u64 ne[n_dims]
// innermost first, u32 ggml type, u64 offset into the data section), padding to
// `general.alignment` (default 32), the data section. Strings are u64 length + bytes.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/ggml_blocks.h"

namespace diffuse::io {

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order (outermost first): ne reversed
  quant::GgmlType type = quant::GgmlType::F32;
  uint64_t offset = 0;  // into the data section
  uint64_t bytes = 0;
  int64_t elements() const;
};

class GgufFile {
 public:
  // Opens and validates the file: IoError if it cannot be read, FormatError naming the field or
  // tensor otherwise (bad magic, an unsupported version, counts or strings longer than the file,
  // an unknown tensor type, a row that is not whole blocks, a tensor outside the data section or
  // overlapping another, a duplicate name).
  static std::shared_ptr<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  // Tensor names in file order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const GgufTensorInfo& info(const std::string& name) const;
  // Scalars and strings as JSON values; arrays of up to 64 elements as arrays, longer ones (a
  // tokenizer's vocabulary) as {"array": type, "count": n}.
  const std::map<std::string, nlohmann::json>& metadata() const { return metadata_; }
  // A string metadata value, or "" when absent or not a string.
  std::string metadata_string(const std::string& key) const;

  // The tensor's bytes as stored (blocks for quantized types).
  const uint8_t* data(const std::string& name) const;
  // Gives the whole pages of the tensor's bytes (of every tensor when `name` is empty) back to
  // the OS once they were copied: they leave the process's RSS, and a later read faults them in
  // again from the file. Loading calls it so that a 12 GB file is not held twice, mapped and
  // copied.
  void release_pages(const std::string& name = "") const;
  // The same for the bytes under a read_only_view (nothing for a tensor elsewhere).
  void release_pages(const torch::Tensor& view) const;
  // A float32 tensor in PyTorch's shape: quantized blocks dequantized exactly as ggml does,
  // F16/BF16 widened.
  torch::Tensor dequantized(const std::string& name) const;
  // F32/F16/BF16 tensors in their own dtype, quantized ones dequantized to float32.
  torch::Tensor get(const std::string& name) const;
  // As get, but F32/F16/BF16 tensors are views of the read-only mapping, valid while this file
  // is open and never to be written: for copying into a model's parameters without a second
  // copy beside them.
  torch::Tensor read_only_view(const std::string& name) const;

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

 private:
  GgufFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  uint32_t version_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, GgufTensorInfo> infos_;
  std::map<std::string, nlohmann::json> metadata_;
};

// One tensor to write: `values` (any float dtype, any shape) stored as `type`. The innermost
// dimension must be whole blocks of the type.
// Either `values` now, or `shape` and `produce`, called when the tensor's turn comes to be written
// (so that a writer never holds more than one tensor: a 17B transformer made block by block).
struct GgufTensorToWrite {
  std::string name;
  torch::Tensor values;
  quant::GgmlType type = quant::GgmlType::F32;
  std::vector<int64_t> shape{};              // when values is undefined
  std::function<torch::Tensor()> produce{};  // when values is undefined: a tensor of `shape`
};

// Writes a version-3 GGUF file atomically (temporary file + rename) with string metadata
// (general.architecture, ...) and the tensors in the order given, each quantized just before it
// is written (the writer holds one tensor's blocks at a time). InvalidArgument for a type
// that cannot be written or a shape that is not whole blocks; IoError on write failure.
void write_gguf(const std::string& path, const std::map<std::string, std::string>& metadata,
                const std::vector<GgufTensorToWrite>& tensors);

}  // namespace diffuse::io
