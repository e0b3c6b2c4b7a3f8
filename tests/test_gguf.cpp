// GGUF and ggml's block types: every type's dequantization against an element-by-element
// float64 evaluation of ggml's formulas on random blocks (a second, independent reading of the
// bit layouts), the reference quantizers, a write/read round trip, and malformed files refused
// with the field named (these run under the sanitizer job and are fuzzed).
#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "quant/ggml_blocks.h"
#include "test_util.h"

namespace diffuse {
namespace test_gguf {

using quant::GgmlType;

uint16_t half_bits(float v) {
  return c10::detail::fp16_ieee_from_fp32_value(v);
}
double half_value(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(b);
}

// Random bytes with the fp16 (or f32) scale fields set to finite values of either sign.
std::vector<uint8_t> random_blocks(GgmlType type, int blocks, std::mt19937& rng) {
  const auto& t = quant::ggml_type_traits(type);
  std::vector<uint8_t> b(static_cast<size_t>(t.block_bytes * blocks));
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int i = 0; i < blocks; ++i) {
    uint8_t* p = b.data() + i * t.block_bytes;
    auto set_half = [&](size_t at) {
      const uint16_t h = half_bits(scale(rng));
      std::memcpy(p + at, &h, 2);
    };
    switch (type) {
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
        set_half(0);
        break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
      case GgmlType::Q8_1:
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        set_half(0);
        set_half(2);
        break;
      case GgmlType::Q2_K:
        set_half(80);
        set_half(82);
        break;
      case GgmlType::Q3_K:
        set_half(108);
        break;
      case GgmlType::Q6_K:
        set_half(208);
        break;
      case GgmlType::Q8_K: {
        const float d = scale(rng);
        std::memcpy(p, &d, 4);
        break;
      }
      default:
        break;
    }
  }
  return b;
}

// Element i of one block by ggml's formulas, in float64, read element by element.
struct Expected {
  double value, magnitude;  // the value and the sum of its terms' magnitudes (for the bound)
};

// 6-bit scale/min pair j of the Q4_K/Q5_K table.
void k4_scale_min(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K's 16 scales unpacked as ggml does, through 32-bit words and masks.
std::array<int, 16> q3k_scales(const uint8_t* s12) {
  uint32_t aux[4];
  std::memcpy(aux, s12, 12);
  const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::array<int, 16> out{};
  const auto* bytes = reinterpret_cast<const int8_t*>(aux);
  for (int i = 0; i < 16; ++i) out[i] = bytes[i] - 32;
  return out;
}

Expected expected(GgmlType type, const uint8_t* b, int i) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      const bool min = type == GgmlType::Q4_1;
      const double d = half_value(b), m = min ? half_value(b + 2) : 0;
      const uint8_t byte = b[(min ? 4 : 2) + i % 16];
      const int nib = i < 16 ? byte & 0xF : byte >> 4;
      const double q = min ? nib : nib - 8;
      return {q * d + m, std::fabs(q * d) + std::fabs(m)};
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool min = type == GgmlType::Q5_1;
      const double d = half_value(b), m = min ? half_value(b + 2) : 0;
      uint32_t qh;
      std::memcpy(&qh, b + (min ? 4 : 2), 4);
      const uint8_t byte = b[(min ? 8 : 6) + i % 16];
      const int nib = (i < 16 ? byte & 0xF : byte >> 4) | static_cast<int>(((qh >> i) & 1) << 4);
      const double q = min ? nib : nib - 16;
      return {q * d + m, std::fabs(q * d) + std::fabs(m)};
    }
    case GgmlType::Q8_0:
    case GgmlType::Q8_1: {
      const double d = half_value(b);
      const double q = static_cast<int8_t>(b[(type == GgmlType::Q8_0 ? 2 : 4) + i]);
      return {q * d, std::fabs(q * d)};
    }
    case GgmlType::Q2_K: {
      const int n = i / 128, j = i % 128 / 32, l = i % 32;
      const int sc = b[8 * n + 2 * j + (l >= 16)];
      const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
      const double d = half_value(b + 80), dmin = half_value(b + 82);
      const double a = d * (sc & 0xF) * q, c = dmin * (sc >> 4);
      return {a - c, std::fabs(a) + std::fabs(c)};
    }
    case GgmlType::Q3_K: {
      const int n = i / 128, j = i % 128 / 32, l = i % 32;
      const auto scales = q3k_scales(b + 96);
      const int low = (b[32 + 32 * n + l] >> (2 * j)) & 3;
      const bool high = (b[l] >> (4 * n + j)) & 1;
      const double v =
          half_value(b + 108) * scales[8 * n + 2 * j + (l >= 16)] * (low - (high ? 0 : 4));
      return {v, std::fabs(v)};
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = type == GgmlType::Q5_K;
      const int g = i / 64, hi = i % 64 >= 32, l = i % 32;
      int sc, m;
      k4_scale_min(b + 4, 2 * g + hi, &sc, &m);
      const uint8_t byte = b[16 + (five ? 32 : 0) + 32 * g + l];
      int q = hi ? byte >> 4 : byte & 0xF;
      if (five) q += ((b[16 + l] >> (2 * g + hi)) & 1) * 16;
      const double a = half_value(b) * sc * q, c = half_value(b + 2) * m;
      return {a - c, std::fabs(a) + std::fabs(c)};
    }
    case GgmlType::Q6_K: {
      const int n = i / 128, quarter = i % 128 / 32, l = i % 32;
      const uint8_t lo_byte = b[64 * n + l + (quarter % 2 ? 32 : 0)];
      const int lo = quarter < 2 ? lo_byte & 0xF : lo_byte >> 4;
      const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      const int sc = static_cast<int8_t>(b[192 + 8 * n + l / 16 + 2 * quarter]);
      const double v = half_value(b + 208) * sc * q;
      return {v, std::fabs(v)};
    }
    case GgmlType::Q8_K: {
      float d;
      std::memcpy(&d, b, 4);
      const double v = static_cast<double>(d) * static_cast<int8_t>(b[4 + i]);
      return {v, std::fabs(v)};
    }
    default:
      ADD_FAILURE() << "no reference for this type";
      return {0, 0};
  }
}

TEST(GgmlBlocks, EveryTypeDequantizesAsGgmlsFormulas) {
  std::mt19937 rng(11);
  for (auto type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                    GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                    GgmlType::Q6_K, GgmlType::Q8_K}) {
    const auto& t = quant::ggml_type_traits(type);
    SCOPED_TRACE(t.name);
    constexpr int kBlocks = 7;
    const auto bytes = random_blocks(type, kBlocks, rng);
    std::vector<float> out(static_cast<size_t>(t.block_elems * kBlocks));
    quant::dequantize(type, bytes.data(), out.data(), t.block_elems * kBlocks);
    int bad = 0;
    for (int blk = 0; blk < kBlocks; ++blk)
      for (int i = 0; i < t.block_elems; ++i) {
        const auto e = expected(type, bytes.data() + blk * t.block_bytes, i);
        const double got = out[static_cast<size_t>(blk * t.block_elems + i)];
        // float32 evaluation: at most three roundings of terms no larger than `magnitude`.
        const double bound = 4 * std::ldexp(e.magnitude, -24);
        if (std::fabs(got - e.value) > bound && bad++ < 3)
          ADD_FAILURE() << "block " << blk << " element " << i << ": " << got << " vs " << e.value;
      }
    EXPECT_EQ(bad, 0);
  }
}

TEST(GgmlBlocks, ReferenceQuantizersRoundTripWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(32 * 40);
  for (auto& v : x) v = normal(rng);
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;  // an all-zero block: scale 0, values 0
  for (auto type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    const auto& t = quant::ggml_type_traits(type);
    SCOPED_TRACE(t.name);
    std::vector<uint8_t> q(static_cast<size_t>(quant::ggml_row_bytes(type, 32 * 40)));
    quant::quantize(type, x.data(), q.data(), 32 * 40);
    std::vector<float> y(x.size());
    quant::dequantize(type, q.data(), y.data(), 32 * 40);
    for (int blk = 0; blk < 40; ++blk) {
      double amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[blk * 32 + i])));
      // Scale d = amax / 127 (q8_0) or amax / 8 (q4_0), stored in fp16; each value within half
      // a step (rounding) plus the scale's own rounding (2^-11 relative) times the largest code.
      const double d = half_value(q.data() + blk * t.block_bytes);
      // q4_0 maps the largest value to -8 steps: one of the other sign as large is clamped to
      // +7 steps, a whole step off.
      const double codes = type == GgmlType::Q8_0 ? 127 : 8;
      const double steps = type == GgmlType::Q8_0 ? 0.5 : 1.0;
      for (int i = 0; i < 32; ++i) {
        const double err = std::fabs(double(y[blk * 32 + i]) - x[blk * 32 + i]);
        EXPECT_LE(err, steps * std::fabs(d) + codes * std::ldexp(amax / codes, -11) + 1e-7)
            << "block " << blk << " element " << i;
      }
    }
    EXPECT_EQ(y[0], 0.0f);
  }
  EXPECT_THROW(quant::quantize(GgmlType::Q4_K, x.data(), nullptr, 256), InvalidArgument);
  EXPECT_THROW(quant::quantize(GgmlType::Q8_0, x.data(), nullptr, 33), InvalidArgument);
}

TEST(Gguf, WritesAndReadsBackEveryWritableType) {
  test::TempDir dir;
  const std::string path = dir.file("model.gguf");
  torch::manual_seed(5);
  const auto a = torch::randn({3, 64}), b = torch::randn({64}), c = torch::randn({2, 2, 32});
  const auto d = torch::randn({4, 32}), e = torch::randn({5, 96});
  io::write_gguf(path, {{"general.architecture", "sd1"}, {"general.name", "test"}},
                 {{"a.weight", a, GgmlType::F32},
                  {"b.bias", b, GgmlType::F16},
                  {"c.weight", c, GgmlType::BF16},
                  {"d.weight", d, GgmlType::Q8_0},
                  {"e.weight", e, GgmlType::Q4_0}});
  const auto f = io::GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->names(),
            (std::vector<std::string>{"a.weight", "b.bias", "c.weight", "d.weight", "e.weight"}));
  EXPECT_EQ(f->metadata_string("general.architecture"), "sd1");
  EXPECT_EQ(f->metadata().at("general.alignment"), 32);
  EXPECT_TRUE(torch::equal(f->get("a.weight"), a));
  EXPECT_EQ(f->get("b.bias").scalar_type(), torch::kFloat16);
  EXPECT_TRUE(torch::equal(f->get("b.bias"), b.to(torch::kFloat16)));
  EXPECT_TRUE(torch::equal(f->get("c.weight"), c.to(torch::kBFloat16)));
  EXPECT_EQ(f->info("e.weight").shape, (std::vector<int64_t>{5, 96}));
  EXPECT_EQ(f->info("e.weight").bytes, 5u * 3 * 18);
  for (const char* name : {"d.weight", "e.weight"}) {
    const auto& info = f->info(name);
    const auto src = std::string(name) == "d.weight" ? d : e;
    std::vector<uint8_t> q(static_cast<size_t>(quant::ggml_row_bytes(info.type, src.numel())));
    quant::quantize(info.type, src.contiguous().data_ptr<float>(), q.data(), src.numel());
    EXPECT_EQ(std::memcmp(q.data(), f->data(name), q.size()), 0) << name;
    const auto back = f->get(name);
    EXPECT_EQ(back.sizes(), src.sizes());
    EXPECT_LT((back - src).abs().max().item<float>(), 0.5f) << name;
  }
  EXPECT_THROW(f->info("nothing"), InvalidArgument);
  // Shapes that are not whole blocks and unwritable types are refused before the file is made.
  EXPECT_THROW(
      io::write_gguf(dir.file("bad.gguf"), {}, {{"x", torch::zeros({3, 33}), GgmlType::Q8_0}}),
      InvalidArgument);
  EXPECT_THROW(
      io::write_gguf(dir.file("bad.gguf"), {}, {{"x", torch::zeros({256}), GgmlType::Q6_K}}),
      InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.gguf")));
}

// A GGUF built field by field, so that each field can be made wrong.
struct Builder {
  std::string bytes;
  template <typename T>
  Builder& put(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Builder& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes += s;
    return *this;
  }
};

struct FileSpec {
  uint32_t magic = 0x46554747, version = 3;
  uint64_t tensors = 1, kvs = 1;
  uint64_t key_length_extra = 0;  // added to the key's declared length
  uint32_t n_dims = 2;
  uint64_t ne0 = 32, ne1 = 2;
  uint32_t type = 8;  // q8_0
  uint64_t offset = 0;
  size_t data_bytes = 2 * 34;
  bool second_tensor_same_name = false;
};

std::string build(const FileSpec& s) {
  Builder b;
  b.put(s.magic).put(s.version).put(s.tensors).put(s.kvs);
  b.put<uint64_t>(std::string("general.name").size() + s.key_length_extra);
  b.bytes += "general.name";
  b.put<uint32_t>(8).str("x");
  auto tensor = [&](const std::string& name, uint64_t offset) {
    b.str(name).put(s.n_dims).put(s.ne0);
    if (s.n_dims > 1) b.put(s.ne1);
    for (uint32_t i = 2; i < s.n_dims && i < 8; ++i) b.put<uint64_t>(1);
    b.put(s.type).put(offset);
  };
  tensor("w", s.offset);
  if (s.second_tensor_same_name) tensor("w", 128);
  while (b.bytes.size() % 32) b.bytes += '\0';
  b.bytes += std::string(s.data_bytes, '\x01');
  return b.bytes;
}

std::string open_error(const std::string& bytes) {
  test::TempDir dir;
  const auto path = dir.file("f.gguf");
  std::ofstream(path, std::ios::binary) << bytes;
  return test::expect_throw<FormatError>([&] { io::GgufFile::open(path); });
}

TEST(Gguf, MalformedFilesAreRefusedNamingTheField) {
  {
    test::TempDir dir;
    std::ofstream(dir.file("ok.gguf"), std::ios::binary) << build({});
    const auto f = io::GgufFile::open(dir.file("ok.gguf"));
    EXPECT_EQ(f->info("w").shape, (std::vector<int64_t>{2, 32}));
  }
  // One field made wrong at a time, and what the message must say.
  const std::vector<std::pair<std::function<void(FileSpec&)>, std::string>> cases = {
      {[](FileSpec& s) { s.magic = 0x46554748; }, "not a GGUF file"},
      {[](FileSpec& s) { s.version = 1; }, "version 1 is not supported"},
      {[](FileSpec& s) { s.tensors = 1ull << 60; }, "tensor infos cannot fit"},
      {[](FileSpec& s) { s.kvs = 1ull << 60; }, "metadata entries cannot fit"},
      {[](FileSpec& s) { s.key_length_extra = 1ull << 50; }, "does not fit in the file"},
      {[](FileSpec& s) { s.type = 99; }, "ggml type 99 is not supported"},
      {[](FileSpec& s) { s.ne0 = 33; }, "not whole q8_0 blocks"},
      {[](FileSpec& s) { s.n_dims = 5; }, "5 dimensions"},
      {[](FileSpec& s) { s.ne1 = 0; }, "empty or too large"},
      {[](FileSpec& s) { s.ne1 = 1ull << 62; }, "empty or too large"},
      {[](FileSpec& s) { s.offset = 7; }, "not a multiple of the 32-byte alignment"},
      {[](FileSpec& s) { s.offset = 1 << 20; }, "beyond the end of the file"},
      {[](FileSpec& s) { s.data_bytes = 50; }, "beyond the end of the file"},  // truncated data
      {[](FileSpec& s) {
         s.second_tensor_same_name = true;
         s.tensors = 2;
       },
       "appears twice"},
  };
  for (const auto& [make_wrong, needle] : cases) {
    FileSpec s;
    make_wrong(s);
    const auto m = open_error(build(s));
    EXPECT_NE(m.find(needle), std::string::npos) << needle << " -> " << m;
  }
  // Every prefix of a valid file: refused, never a crash or a read past the end.
  const auto whole = build({});
  for (size_t n = 0; n < whole.size(); n += 3) EXPECT_FALSE(open_error(whole.substr(0, n)).empty());
}

}  // namespace test_gguf
}  // namespace diffuse
