// safetensors reader (mmap, zero-copy where possible) and writer (atomic).
// Format: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then data.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace diffuse::io {

struct TensorInfo {
  std::string name;
  std::string dtype;  // as written in the file: F32, BF16, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// Maps a safetensors dtype name to a torch dtype; throws FormatError for unknown names.
torch::Dtype safetensors_dtype(const std::string& name);
// The reverse; throws InvalidArgument for dtypes safetensors cannot store.
std::string safetensors_dtype_name(torch::Dtype dtype);

class SafetensorsFile {
 public:
  // Opens and validates the file. Throws IoError (cannot open/map) or FormatError (bad
  // content: truncated, bad JSON, unknown dtype, offsets out of range or overlapping, ...).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in file order of their data offsets.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A CPU tensor viewing the mapped bytes (no copy) when they are suitably aligned, else a
  // copy. The mapping stays alive while any returned tensor does. Writing to a returned
  // tensor never changes the file (private copy-on-write mapping).
  torch::Tensor get(const std::string& name) const;
  // All tensors, by name.
  std::map<std::string, torch::Tensor> load_all() const;

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

 private:
  SafetensorsFile() = default;
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// For a tensor returned by SafetensorsFile::get that viewed the mapped file: gives the
// whole pages of its bytes back to the OS (they leave the process's RSS; a later read faults
// them in again from the file, so values written through such a tensor are lost). Loading
// calls it after copying each weight, so a model converted to another dtype does not hold
// its file's pages as well. Returns the bytes released (0 for any other tensor).
size_t release_mapped_pages(const torch::Tensor& t);
// Asks the OS to start reading the tensor's pages from the file now (read-ahead), so that a
// later use finds them in memory. Returns the bytes advised (0 for a tensor that is not in
// one of our mappings).
size_t prefetch_mapped_pages(const torch::Tensor& t);
// Whether the tensor's bytes lie in a file mapping of ours: writing to it would write into a
// private copy-on-write page that release_mapped_pages throws away.
bool is_file_mapped(const torch::Tensor& t);

// Parses and validates a header against a data section of `data_size` bytes. Exposed for
// tests; `where` names the source in error messages.
void parse_safetensors_header(const std::string& header_json, uint64_t data_size,
                              const std::string& where, std::vector<TensorInfo>* infos,
                              std::map<std::string, std::string>* metadata);

// Writes tensors (any device/layout; stored contiguous, in the given order) atomically.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A tensor made only when its bytes are written: the header needs just its dtype and shape.
struct SafetensorsTensorToWrite {
  std::string name;
  torch::Dtype dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  std::function<torch::Tensor()> produce;  // a tensor of `dtype` and `shape`
};

// As save_safetensors, calling each tensor's `produce` just before writing it, so that the
// writer holds one tensor at a time. InvalidArgument when a produced tensor is not the dtype
// and shape declared (nothing is left behind).
void save_safetensors_streamed(const std::string& path,
                               const std::vector<SafetensorsTensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace diffuse::io
