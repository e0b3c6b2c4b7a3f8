#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "io/input_file.h"

namespace diffuse::io {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;          // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 4;  // arrays of arrays are legal; deeper ones are abuse
constexpr size_t kArrayKeptElements = 64;

enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Reads the header fields in order, every read checked against the end of the file.
class Reader {
 public:
  Reader(const uint8_t* p, uint64_t size, std::string path)
      : p_(p), size_(size), path_(std::move(path)) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("GGUF file '" + path_ + "': " + what + " (at byte " + std::to_string(pos_) +
                      " of " + std::to_string(size_) + ")");
  }

  template <typename T>
  T read(const char* what) {
    if (left() < sizeof(T)) fail(std::string("truncated while reading ") + what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string string(const char* what) {
    const auto n = read<uint64_t>(what);
    if (n > left())
      fail(std::string(what) + ": a string of " + std::to_string(n) +
           " bytes does not fit in the file");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }

  void skip(uint64_t n, const char* what) {
    if (n > left()) fail(std::string("truncated inside ") + what);
    pos_ += n;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string path_;
};

uint64_t scalar_bytes(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

nlohmann::json read_scalar(Reader& r, uint32_t type, const char* what) {
  switch (type) {
    case kU8:
      return r.read<uint8_t>(what);
    case kI8:
      return r.read<int8_t>(what);
    case kU16:
      return r.read<uint16_t>(what);
    case kI16:
      return r.read<int16_t>(what);
    case kU32:
      return r.read<uint32_t>(what);
    case kI32:
      return r.read<int32_t>(what);
    case kF32:
      return r.read<float>(what);
    case kBool:
      return r.read<uint8_t>(what) != 0;
    case kU64:
      return r.read<uint64_t>(what);
    case kI64:
      return r.read<int64_t>(what);
    case kF64:
      return r.read<double>(what);
    case kString:
      return r.string(what);
    default:
      r.fail(std::string(what) + ": unknown value type " + std::to_string(type));
  }
}

nlohmann::json read_value(Reader& r, uint32_t type, const std::string& key, int depth) {
  if (type != kArray) return read_scalar(r, type, key.c_str());
  if (depth >= kMaxArrayNesting)
    r.fail(key + ": arrays nested deeper than " + std::to_string(kMaxArrayNesting));
  const auto elem = r.read<uint32_t>(key.c_str());
  const auto count = r.read<uint64_t>(key.c_str());
  // Every element takes at least one byte (strings 8): a count beyond that is a lie.
  const uint64_t least = elem == kString || elem == kArray ? 8 : scalar_bytes(elem);
  if (least == 0) r.fail(key + ": array of unknown value type " + std::to_string(elem));
  if (count > r.left() / least)
    r.fail(key + ": an array of " + std::to_string(count) + " elements does not fit in the file");
  if (count > kArrayKeptElements) {
    if (elem == kString || elem == kArray) {
      for (uint64_t i = 0; i < count; ++i) read_value(r, elem, key, depth + 1);
    } else {
      r.skip(count * least, key.c_str());
    }
    return {{"array", elem}, {"count", count}};
  }
  nlohmann::json a = nlohmann::json::array();
  for (uint64_t i = 0; i < count; ++i) a.push_back(read_value(r, elem, key, depth + 1));
  return a;
}

}  // namespace

int64_t GgufTensorInfo::elements() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  require_regular_file(path, "GGUF file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open GGUF file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("cannot stat GGUF file '" + path + "': " + std::strerror(err));
  }
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_size_ = static_cast<size_t>(st.st_size);
  if (f->map_size_ > 0) {
    f->map_ = ::mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map_ == MAP_FAILED) {
      const int err = errno;
      f->map_ = nullptr;
      ::close(fd);
      throw IoError("cannot map GGUF file '" + path + "': " + std::strerror(err));
    }
  }
  ::close(fd);
  const auto* base = static_cast<const uint8_t*>(f->map_);
  Reader r(base, f->map_size_, path);

  if (r.read<uint32_t>("the magic") != kMagic) r.fail("not a GGUF file (the magic is not 'GGUF')");
  f->version_ = r.read<uint32_t>("the version");
  if (f->version_ != 2 && f->version_ != 3)
    r.fail("version " + std::to_string(f->version_) + " is not supported (2 and 3 are)");
  const auto n_tensors = r.read<uint64_t>("the tensor count");
  const auto n_kv = r.read<uint64_t>("the metadata count");
  // A metadata entry takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8.
  if (n_kv > r.left() / 13)
    r.fail(std::to_string(n_kv) + " metadata entries cannot fit in the file");
  for (uint64_t i = 0; i < n_kv; ++i) {
    const auto key = r.string("a metadata key");
    const auto type = r.read<uint32_t>("a metadata type");
    f->metadata_[key] = read_value(r, type, key, 0);
  }
  uint64_t alignment = kDefaultAlignment;
  if (auto it = f->metadata_.find("general.alignment"); it != f->metadata_.end()) {
    if (!it->second.is_number_unsigned() || it->second.get<uint64_t>() == 0 ||
        (it->second.get<uint64_t>() & (it->second.get<uint64_t>() - 1)) != 0)
      r.fail("general.alignment must be a power of two, got " + it->second.dump());
    alignment = it->second.get<uint64_t>();
  }
  if (n_tensors > r.left() / 32)
    r.fail(std::to_string(n_tensors) + " tensor infos cannot fit in the file");
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string("a tensor name");
    const std::string what = "tensor '" + t.name + "'";
    if (f->infos_.count(t.name)) r.fail(what + " appears twice");
    const auto n_dims = r.read<uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      r.fail(what + ": " + std::to_string(n_dims) + " dimensions (1 to 4 expected)");
    std::vector<int64_t> ne(n_dims);
    uint64_t elements = 1;
    for (auto& d : ne) {
      const auto v = r.read<uint64_t>("a tensor dimension");
      if (v == 0 || v > (1ull << 40) || elements > (1ull << 40) / v)
        r.fail(what + ": dimension " + std::to_string(v) + " is empty or too large");
      d = static_cast<int64_t>(v);
      elements *= v;
    }
    const auto type_id = r.read<uint32_t>("a tensor type");
    const auto traits = quant::ggml_type_traits(type_id);
    if (!traits)
      r.fail(what + ": ggml type " + std::to_string(type_id) +
             " is not supported (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k ... q8_k are)");
    if (ne[0] % traits->block_elems != 0)
      r.fail(what + ": rows of " + std::to_string(ne[0]) + " elements are not whole " +
             traits->name + " blocks of " + std::to_string(traits->block_elems));
    t.type = traits->type;
    t.offset = r.read<uint64_t>("a tensor offset");
    if (t.offset % alignment != 0)
      r.fail(what + ": offset " + std::to_string(t.offset) + " is not a multiple of the " +
             std::to_string(alignment) + "-byte alignment");
    t.bytes = elements / static_cast<uint64_t>(traits->block_elems) *
              static_cast<uint64_t>(traits->block_bytes);
    t.shape.assign(ne.rbegin(), ne.rend());
    f->names_.push_back(t.name);
    f->infos_[t.name] = std::move(t);
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  if (data_start > f->map_size_ && n_tensors > 0) r.fail("the data section is missing");
  f->data_ = base + std::min<uint64_t>(data_start, f->map_size_);
  f->data_size_ = f->map_size_ - std::min<uint64_t>(data_start, f->map_size_);
  // Every tensor inside the data section, none overlapping another.
  std::map<uint64_t, const GgufTensorInfo*> by_offset;
  for (const auto& [name, t] : f->infos_) {
    if (t.offset > f->data_size_ || t.bytes > f->data_size_ - t.offset)
      throw FormatError("GGUF file '" + path + "': tensor '" + name + "' (" +
                        std::to_string(t.bytes) + " bytes at data offset " +
                        std::to_string(t.offset) + ") lies beyond the end of the file (data " +
                        "section of " + std::to_string(f->data_size_) + " bytes): truncated?");
    by_offset[t.offset] = &t;
  }
  uint64_t end = 0;
  const GgufTensorInfo* prev = nullptr;
  for (const auto& [offset, t] : by_offset) {
    if (prev && offset < end)
      throw FormatError("GGUF file '" + path + "': tensors '" + prev->name + "' and '" + t->name +
                        "' overlap");
    end = offset + t->bytes;
    prev = t;
  }
  if (by_offset.size() != f->infos_.size()) {
    // Two tensors at one offset: at least one has bytes, or both are empty (impossible: no
    // dimension is 0), so they overlap.
    throw FormatError("GGUF file '" + path + "': two tensors start at the same offset");
  }
  return f;
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, map_size_);
}

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end())
    throw InvalidArgument("GGUF file '" + path_ + "' has no tensor '" + name + "'");
  return it->second;
}

std::string GgufFile::metadata_string(const std::string& key) const {
  auto it = metadata_.find(key);
  return it != metadata_.end() && it->second.is_string() ? it->second.get<std::string>() : "";
}

const uint8_t* GgufFile::data(const std::string& name) const {
  return data_ + info(name).offset;
}

namespace {

// Gives the whole pages within [begin, end) back to the OS: the pages at either end may hold a
// neighbour's bytes.
void release_whole_pages(uintptr_t begin, uintptr_t end) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace

void GgufFile::release_pages(const std::string& name) const {
  if (!map_ || data_size_ == 0) return;
  uintptr_t begin = reinterpret_cast<uintptr_t>(data_), end = begin + data_size_;
  if (!name.empty()) {
    const auto& t = info(name);
    begin = reinterpret_cast<uintptr_t>(data_ + t.offset);
    end = begin + t.bytes;
  }
  release_whole_pages(begin, end);
}

void GgufFile::release_pages(const torch::Tensor& view) const {
  if (!map_ || data_size_ == 0 || !view.defined() || !view.is_contiguous()) return;
  const auto begin = reinterpret_cast<uintptr_t>(view.data_ptr()),
             end = begin + static_cast<uintptr_t>(view.nbytes());
  const auto data = reinterpret_cast<uintptr_t>(data_);
  if (begin >= data && end <= data + data_size_) release_whole_pages(begin, end);
}

torch::Tensor GgufFile::dequantized(const std::string& name) const {
  const auto& t = info(name);
  auto out = torch::empty(t.shape, torch::kFloat32);
  quant::dequantize(t.type, data_ + t.offset, out.data_ptr<float>(), t.elements());
  return out;
}

namespace {

std::optional<torch::Dtype> torch_dtype_of(quant::GgmlType type) {
  switch (type) {
    case quant::GgmlType::F32:
      return torch::kFloat32;
    case quant::GgmlType::F16:
      return torch::kFloat16;
    case quant::GgmlType::BF16:
      return torch::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace

torch::Tensor GgufFile::get(const std::string& name) const {
  const auto& t = info(name);
  const auto dtype = torch_dtype_of(t.type);
  if (!dtype) return dequantized(name);
  auto out = torch::empty(t.shape, *dtype);
  std::memcpy(out.data_ptr(), data_ + t.offset, t.bytes);
  return out;
}

torch::Tensor GgufFile::read_only_view(const std::string& name) const {
  const auto& t = info(name);
  const auto dtype = torch_dtype_of(t.type);
  // The data section and every tensor in it are aligned (general.alignment, 32 by default).
  if (!dtype || reinterpret_cast<uintptr_t>(data_ + t.offset) % c10::elementSize(*dtype) != 0)
    return get(name);
  return torch::from_blob(const_cast<uint8_t*>(data_ + t.offset), t.shape,
                          torch::TensorOptions().dtype(*dtype));
}

namespace {

void put_u32(std::ostream& out, uint32_t v) {
  out.write(reinterpret_cast<const char*>(&v), 4);
}
void put_u64(std::ostream& out, uint64_t v) {
  out.write(reinterpret_cast<const char*>(&v), 8);
}
void put_string(std::ostream& out, const std::string& s) {
  put_u64(out, s.size());
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}
void pad_to(std::ostream& out, uint64_t& pos, uint64_t alignment) {
  static const char zeros[64] = {};
  const uint64_t n = (alignment - pos % alignment) % alignment;
  out.write(zeros, static_cast<std::streamsize>(n));
  pos += n;
}

}  // namespace

void write_gguf(const std::string& path, const std::map<std::string, std::string>& metadata,
                const std::vector<GgufTensorToWrite>& tensors) {
  if (metadata.count("general.alignment"))
    throw InvalidArgument("write_gguf: general.alignment is written by the writer itself");
  // Every tensor's shape and size first, so that a bad one is refused before the file is started.
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint64_t> sizes;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (!seen.insert(t.name).second)
      throw InvalidArgument("write_gguf: tensor '" + t.name + "' is given twice");
    const auto& traits = quant::ggml_type_traits(t.type);
    if (!quant::can_quantize(t.type))
      throw InvalidArgument("write_gguf: tensor '" + t.name + "': writing " + traits.name +
                            " is not supported");
    if (!t.values.defined() && !t.produce)
      throw InvalidArgument("write_gguf: tensor '" + t.name +
                            "' has neither values nor a producer");
    const std::vector<int64_t> shape = t.values.defined() ? t.values.sizes().vec() : t.shape;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (shape.empty() || static_cast<int>(shape.size()) > kMaxDims || numel <= 0)
      throw InvalidArgument("write_gguf: tensor '" + t.name + "' must have 1 to 4 non-empty " +
                            "dimensions");
    if (shape.back() % traits.block_elems != 0)
      throw InvalidArgument("write_gguf: tensor '" + t.name + "': rows of " +
                            std::to_string(shape.back()) + " are not whole " + traits.name +
                            " blocks of " + std::to_string(traits.block_elems));
    shapes.push_back(shape);
    sizes.push_back(static_cast<uint64_t>(quant::ggml_row_bytes(t.type, numel)));
  }
  write_file_atomically(path, [&](std::ostream& out) {
    uint64_t pos = 0;
    put_u32(out, kMagic);
    put_u32(out, 3);
    put_u64(out, tensors.size());
    put_u64(out, metadata.size() + 1);
    pos += 24;
    auto kv_string = [&](const std::string& key, const std::string& value) {
      put_string(out, key);
      put_u32(out, kString);
      put_string(out, value);
      pos += 8 + key.size() + 4 + 8 + value.size();
    };
    put_string(out, "general.alignment");
    put_u32(out, kU32);
    put_u32(out, static_cast<uint32_t>(kDefaultAlignment));
    pos += 8 + 17 + 4 + 4;
    for (const auto& [k, v] : metadata) kv_string(k, v);
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      const auto& shape = shapes[i];
      put_string(out, t.name);
      put_u32(out, static_cast<uint32_t>(shape.size()));
      for (auto d = shape.rbegin(); d != shape.rend(); ++d) put_u64(out, static_cast<uint64_t>(*d));
      put_u32(out, static_cast<uint32_t>(t.type));
      put_u64(out, offset);
      pos += 8 + t.name.size() + 4 + 8 * static_cast<uint64_t>(shape.size()) + 4 + 8;
      offset += (sizes[i] + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
    }
    pad_to(out, pos, kDefaultAlignment);
    std::vector<uint8_t> blob;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      auto v = t.values.defined() ? t.values : t.produce();
      if (!v.defined() || v.sizes().vec() != shapes[i])
        throw InvalidArgument("write_gguf: tensor '" + t.name + "' was produced with shape " +
                              (v.defined() ? c10::str(v.sizes()) : std::string("none")) +
                              ", announced " + c10::str(c10::IntArrayRef(shapes[i])));
      const auto values = v.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      blob.resize(static_cast<size_t>(sizes[i]));
      quant::quantize(t.type, values.data_ptr<float>(), blob.data(), values.numel());
      out.write(reinterpret_cast<const char*>(blob.data()),
                static_cast<std::streamsize>(blob.size()));
      pos += blob.size();
      pad_to(out, pos, kDefaultAlignment);
    }
  });
}

}  // namespace diffuse::io
