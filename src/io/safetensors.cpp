#include "io/safetensors.h"
#include "io/input_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "diffuse/errors.h"
#include "io/atomic_file.h"

namespace diffuse::io {
namespace {

// Larger headers are certainly corrupt; the reference implementation uses the same bound.
constexpr uint64_t kMaxHeaderSize = 100u * 1024 * 1024;

enum class Fp8 { none, e4m3fn, e5m2 };

struct DtypeEntry {
  const char* name;
  torch::Dtype dtype;  // what get() returns
  size_t size;         // bytes per element in the file
  Fp8 fp8 = Fp8::none;
};
// LibTorch 1.13 has no float8 types: fp8 tensors (ComfyUI's FLUX/SD3 checkpoints) are widened to
// bf16 on read, which holds every e4m3fn and e5m2 value exactly.
const DtypeEntry kDtypes[] = {
    {"F64", torch::kFloat64, 8},
    {"F32", torch::kFloat32, 4},
    {"F16", torch::kFloat16, 2},
    {"BF16", torch::kBFloat16, 2},
    {"I64", torch::kInt64, 8},
    {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2},
    {"I8", torch::kInt8, 1},
    {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
    {"F8_E4M3", torch::kBFloat16, 1, Fp8::e4m3fn},
    {"F8_E5M2", torch::kBFloat16, 1, Fp8::e5m2},
};

// The value of every fp8 byte as bf16 bits (exact): e4m3fn has bias 7, no infinities and NaN at
// S.1111.111; e5m2 has bias 15 and IEEE infinities and NaNs.
const std::array<uint16_t, 256>& fp8_to_bf16(Fp8 kind) {
  static const auto make = [](Fp8 k) {
    std::array<uint16_t, 256> t{};
    const int mbits = k == Fp8::e4m3fn ? 3 : 2, bias = k == Fp8::e4m3fn ? 7 : 15;
    const int emax = k == Fp8::e4m3fn ? 15 : 31;
    for (int b = 0; b < 256; ++b) {
      const int sign = b >> 7, e = (b >> mbits) & emax, m = b & ((1 << mbits) - 1);
      float v;
      if (k == Fp8::e4m3fn && e == 15 && m == 7)
        v = std::numeric_limits<float>::quiet_NaN();
      else if (k == Fp8::e5m2 && e == 31)
        v = m == 0 ? std::numeric_limits<float>::infinity()
                   : std::numeric_limits<float>::quiet_NaN();
      else if (e == 0)
        v = std::ldexp(static_cast<float>(m), 1 - bias - mbits);
      else
        v = std::ldexp(1.0f + static_cast<float>(m) / static_cast<float>(1 << mbits), e - bias);
      t[b] = c10::BFloat16(sign ? -v : v).x;
    }
    return t;
  };
  static const auto e4m3 = make(Fp8::e4m3fn), e5m2 = make(Fp8::e5m2);
  return kind == Fp8::e4m3fn ? e4m3 : e5m2;
}

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& e : kDtypes)
    if (name == e.name) return &e;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& e : kDtypes) s += (s.empty() ? "" : " ") + std::string(e.name);
  return s;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

}  // namespace

torch::Dtype safetensors_dtype(const std::string& name) {
  const DtypeEntry* e = find_dtype(name);
  if (!e)
    throw FormatError("unknown safetensors dtype '" + name + "' (known: " + known_dtypes() + ")");
  return e->dtype;
}

std::string safetensors_dtype_name(torch::Dtype dtype) {
  for (const auto& e : kDtypes)
    if (e.dtype == dtype) return e.name;
  throw InvalidArgument(std::string("safetensors cannot store dtype ") +
                        c10::toString(c10::ScalarType(dtype)));
}

namespace {

// Live mappings by start address, so release_mapped_pages only ever touches our own.
std::mutex g_mappings_mutex;
std::map<uintptr_t, size_t> g_mappings;

}  // namespace

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  void track() {
    std::lock_guard<std::mutex> lock(g_mappings_mutex);
    g_mappings[reinterpret_cast<uintptr_t>(addr)] = size;
  }
  ~Mapping() {
    if (!addr || addr == MAP_FAILED) return;
    {
      std::lock_guard<std::mutex> lock(g_mappings_mutex);
      g_mappings.erase(reinterpret_cast<uintptr_t>(addr));
    }
    ::munmap(addr, size);
  }
};

namespace {

// The whole pages of `t` (when it lies entirely inside one of our mappings) as [first, last);
// the pages at either end may hold the neighbouring tensors' bytes and are left out.
bool mapped_pages(const torch::Tensor& t, uintptr_t* first, uintptr_t* last) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous() || t.nbytes() == 0) return false;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t end = begin + t.nbytes();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  *first = (begin + page - 1) / page * page;
  *last = end / page * page;
  std::lock_guard<std::mutex> lock(g_mappings_mutex);
  auto it = g_mappings.upper_bound(begin);
  if (it == g_mappings.begin()) return false;
  --it;
  return end <= it->first + it->second;  // inside one of our mappings
}

size_t advise(const torch::Tensor& t, int advice) {
  uintptr_t first = 0, last = 0;
  if (!mapped_pages(t, &first, &last) || last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, advice) != 0) return 0;
  return last - first;
}

}  // namespace

size_t release_mapped_pages(const torch::Tensor& t) {
  return advise(t, MADV_DONTNEED);
}

size_t prefetch_mapped_pages(const torch::Tensor& t) {
  return advise(t, MADV_WILLNEED);
}

bool is_file_mapped(const torch::Tensor& t) {
  uintptr_t first = 0, last = 0;
  return mapped_pages(t, &first, &last);
}

void parse_safetensors_header(const std::string& header_json, uint64_t data_size,
                              const std::string& where, std::vector<TensorInfo>* infos,
                              std::map<std::string, std::string>* metadata) {
  nlohmann::json header;
  try {
    // JSON lets a later duplicate key silently replace an earlier one; a header that names a
    // tensor twice is refused instead.
    std::vector<std::set<std::string>> keys;
    std::string duplicate;
    header = nlohmann::json::parse(
        header_json, [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          using Event = nlohmann::json::parse_event_t;
          if (event == Event::object_start) keys.emplace_back();
          if (event == Event::object_end && !keys.empty()) keys.pop_back();
          if (event == Event::key && !keys.empty() && duplicate.empty() &&
              !keys.back().insert(parsed.get<std::string>()).second)
            duplicate = parsed.get<std::string>();
          return true;
        });
    if (!duplicate.empty())
      throw FormatError(where + ": header names '" + duplicate +
                        "' more than once (a later entry would silently replace the first)");
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw FormatError(where + ": header is not a JSON object");
  infos->clear();
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw FormatError(where + ": __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          throw FormatError(where + ": __metadata__['" + m.key() + "'] is not a string");
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string ctx = where + ": tensor '" + name + "'";
    if (!entry.is_object()) throw FormatError(ctx + ": entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      throw FormatError(ctx + ": missing string field 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array())
      throw FormatError(ctx + ": missing array field 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      throw FormatError(ctx + ": 'data_offsets' must be an array of two integers");
    TensorInfo info;
    info.name = name;
    info.dtype = entry["dtype"].get<std::string>();
    const DtypeEntry* dt = find_dtype(info.dtype);
    if (!dt)
      throw FormatError(ctx + ": unknown dtype '" + info.dtype + "' (known: " + known_dtypes() +
                        ")");
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned())
        throw FormatError(ctx + ": shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          mul_overflows(numel, v, &numel))
        throw FormatError(ctx + ": shape is too large");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw FormatError(ctx + ": data_offsets must be non-negative integers");
    info.begin = offs[0].get<uint64_t>();
    info.end = offs[1].get<uint64_t>();
    if (info.begin > info.end)
      throw FormatError(ctx + ": data_offsets [" + std::to_string(info.begin) + ", " +
                        std::to_string(info.end) + "] are reversed");
    if (info.end > data_size)
      throw FormatError(ctx + ": data_offsets end " + std::to_string(info.end) +
                        " is beyond the data section (" + std::to_string(data_size) + " bytes)");
    uint64_t nbytes = 0;
    const bool overflow = mul_overflows(numel, dt->size, &nbytes);
    if (overflow || nbytes != info.end - info.begin)
      throw FormatError(ctx + ": shape and dtype need " +
                        (overflow ? std::string("more than 2^64") : std::to_string(nbytes)) +
                        " bytes but data_offsets span " + std::to_string(info.end - info.begin));
    infos->push_back(std::move(info));
  }
  std::vector<const TensorInfo*> sorted;
  for (const auto& i : *infos) sorted.push_back(&i);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    // Zero-sized tensors may share an offset with their neighbour.
    if (sorted[i]->begin < sorted[i - 1]->end && sorted[i]->begin != sorted[i]->end)
      throw FormatError(where + ": tensors '" + sorted[i - 1]->name + "' and '" + sorted[i]->name +
                        "' have overlapping data");
  }
  std::sort(infos->begin(), infos->end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  require_regular_file(path, "safetensors file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("'" + path + "' is not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw FormatError(path + ": file is " + std::to_string(size) +
                      " bytes, too short for a safetensors header (need at least 8)");
  }
  auto mapping = std::make_shared<Mapping>();
  // Private writable mapping: pages are shared with the page cache until someone writes to a
  // tensor, which then gets its own copy instead of a segfault.
  mapping->addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  mapping->size = size;
  ::close(fd);
  if (mapping->addr == MAP_FAILED) {
    mapping->addr = nullptr;
    throw IoError("cannot mmap '" + path + "': " + std::strerror(errno));
  }
  mapping->track();
  const uint8_t* base = static_cast<const uint8_t*>(mapping->addr);
  uint64_t header_size = read_u64_le(base);
  if (header_size > size - 8)
    throw FormatError(path + ": header length " + std::to_string(header_size) +
                      " is larger than the file (" + std::to_string(size) +
                      " bytes): truncated or not a safetensors file");
  if (header_size > kMaxHeaderSize)
    throw FormatError(path + ": header length " + std::to_string(header_size) +
                      " exceeds the 100 MiB limit");
  std::string header(reinterpret_cast<const char*>(base + 8), header_size);
  std::vector<TensorInfo> infos;
  parse_safetensors_header(header, size - 8 - header_size, path, &infos, &file->metadata_);
  file->mapping_ = mapping;
  file->data_ = base + 8 + header_size;
  file->data_size_ = size - 8 - header_size;
  for (auto& i : infos) {
    file->names_.push_back(i.name);
    file->infos_.emplace(i.name, std::move(i));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) throw FormatError(path_ + ": no tensor named '" + name + "'");
  return it->second;
}

torch::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const DtypeEntry* dt = find_dtype(ti.dtype);
  auto options = torch::TensorOptions().dtype(dt->dtype).device(torch::kCPU);
  uint8_t* ptr = const_cast<uint8_t*>(data_ + ti.begin);
  uint64_t nbytes = ti.end - ti.begin;
  if (nbytes == 0) return torch::empty(ti.shape, options);
  if (dt->fp8 != Fp8::none) {
    const auto& table = fp8_to_bf16(dt->fp8);
    auto t = torch::empty(ti.shape, options);
    auto* out = reinterpret_cast<uint16_t*>(t.data_ptr());
    for (uint64_t i = 0; i < nbytes; ++i) out[i] = table[ptr[i]];
    return t;
  }
  if (dt->dtype == torch::kBool) {
    // Any byte other than 0/1 is not a valid bool and is undefined behaviour once read as one.
    for (uint64_t i = 0; i < nbytes; ++i)
      if (ptr[i] > 1)
        throw FormatError(path_ + ": tensor '" + name +
                          "' has a BOOL byte that is neither 0 nor 1");
  }
  if (reinterpret_cast<uintptr_t>(ptr) % dt->size == 0) {
    auto keep = mapping_;
    return torch::from_blob(
        ptr, ti.shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  // Misaligned data (legal in the format): copy out instead of handing torch a bad pointer.
  auto t = torch::empty(ti.shape, options);
  std::memcpy(t.data_ptr(), ptr, nbytes);
  return t;
}

std::map<std::string, torch::Tensor> SafetensorsFile::load_all() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& n : names_) out.emplace(n, get(n));
  return out;
}

void save_safetensors_streamed(const std::string& path,
                               const std::vector<SafetensorsTensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") throw InvalidArgument("tensor name '__metadata__' is reserved");
    if (header.contains(t.name)) throw InvalidArgument("duplicate tensor name '" + t.name + "'");
    const auto nbytes = static_cast<uint64_t>(c10::multiply_integers(t.shape)) *
                        static_cast<uint64_t>(c10::elementSize(t.dtype));
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  write_file_atomically(path, [&](std::ostream& out) {
    uint8_t len[8];
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors) {
      const auto v = t.produce().detach().to(torch::kCPU).contiguous();
      if (v.scalar_type() != t.dtype || v.sizes() != c10::IntArrayRef(t.shape))
        throw InvalidArgument("safetensors '" + path + "': tensor '" + t.name + "' was declared " +
                              std::string(safetensors_dtype_name(t.dtype)) + " " +
                              c10::str(c10::IntArrayRef(t.shape)) + " and came as " +
                              std::string(safetensors_dtype_name(v.scalar_type())) + " " +
                              c10::str(v.sizes()));
      out.write(static_cast<const char*>(v.data_ptr()),
                static_cast<std::streamsize>(v.numel() * v.element_size()));
    }
  });
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorToWrite> streamed;
  streamed.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors)
    streamed.push_back(
        {name, tensor.scalar_type(), tensor.sizes().vec(), [t = tensor] { return t; }});
  save_safetensors_streamed(path, streamed, metadata);
}

}  // namespace diffuse::io
