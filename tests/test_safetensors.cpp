#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>

#include "diffuse/errors.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace diffuse {
namespace test_safetensors {

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string with_header(const std::string& header, const std::string& data,
                        std::optional<uint64_t> declared = std::nullopt) {
  uint64_t n = declared.value_or(header.size());
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

// Expects FormatError whose message names the file and contains `needle`.
void expect_format_error(const std::string& path, const std::string& needle) {
  try {
    io::SafetensorsFile::open(path);
    FAIL() << "expected FormatError containing '" << needle << "'";
  } catch (const FormatError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(Safetensors, RoundTripsEveryDtype) {
  test::TempDir dir;
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"f64", torch::randn({2, 3}, torch::kFloat64)},
      {"f32", torch::randn({4}, torch::kFloat32)},
      {"f16", torch::randn({3, 1}).to(torch::kFloat16)},
      {"bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"i64", torch::arange(7, torch::kInt64)},
      {"i32", torch::arange(3, torch::kInt32)},
      {"i16", torch::arange(3).to(torch::kInt16)},
      {"i8", torch::arange(-2, 3).to(torch::kInt8)},
      {"u8", torch::arange(250, 256).to(torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::zeros({0, 4})},
  };
  io::save_safetensors(dir.file("a.safetensors"), tensors, {{"format", "pt"}});
  auto f = io::SafetensorsFile::open(dir.file("a.safetensors"));
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto got = f->get(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, t)) << name;
  }
}

TEST(Safetensors, AlignedTensorsAreZeroCopyAndOutliveTheFileObject) {
  test::TempDir dir;
  auto t = torch::arange(16, torch::kFloat32);
  io::save_safetensors(dir.file("a.safetensors"), {{"x", t}});
  torch::Tensor view;
  {
    auto f = io::SafetensorsFile::open(dir.file("a.safetensors"));
    view = f->get("x");
    auto view2 = f->get("x");
    EXPECT_EQ(view.data_ptr(), view2.data_ptr());  // both view the mapping
  }
  EXPECT_TRUE(torch::equal(view, t));
  view.add_(1);  // private mapping: writable, file unchanged
  auto again = io::SafetensorsFile::open(dir.file("a.safetensors"))->get("x");
  EXPECT_TRUE(torch::equal(again, t));
}

TEST(Safetensors, ReleasingMappedPagesKeepsTheValues) {
  test::TempDir dir;
  auto t = torch::randn({512, 1024});  // 2 MiB: whole pages to give back
  auto small = torch::arange(8, torch::kFloat32);
  io::save_safetensors(dir.file("w.safetensors"), {{"small", small}, {"w", t}});
  auto f = io::SafetensorsFile::open(dir.file("w.safetensors"));
  auto w = f->get("w");
  EXPECT_TRUE(torch::equal(w, t));  // pages faulted in
  const size_t released = io::release_mapped_pages(w);
  EXPECT_GT(released, t.nbytes() - 2 * 4096);  // all but the partial pages at either end
  EXPECT_LE(released, t.nbytes());
  EXPECT_TRUE(torch::equal(w, t));                    // read back from the file
  EXPECT_TRUE(torch::equal(f->get("small"), small));  // the neighbour's shared page is kept
  EXPECT_EQ(io::release_mapped_pages(t), 0u);         // not a mapping: untouched
  EXPECT_EQ(io::release_mapped_pages(torch::Tensor()), 0u);
}

TEST(Safetensors, MisalignedDataIsCopied) {
  test::TempDir dir;
  // A 1-byte tensor first pushes the f32 tensor to an odd offset.
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  while ((header.size() + 8) % 8) header += ' ';
  float v = 2.5f;
  std::string data(1, '\7');
  data.append(reinterpret_cast<const char*>(&v), 4);
  write_raw(dir.file("m.safetensors"), with_header(header, data));
  auto f = io::SafetensorsFile::open(dir.file("m.safetensors"));
  EXPECT_FLOAT_EQ(f->get("b").item<float>(), 2.5f);
  EXPECT_EQ(f->get("a").item<uint8_t>(), 7);
}

// fp8 tensors (ComfyUI's checkpoints) read as bf16 holding each value exactly: every byte of both
// formats against its definition (sign, exponent with bias 7 / 15, mantissa; subnormals; e4m3fn's
// single NaN pattern and no infinities; e5m2's IEEE specials).
TEST(Safetensors, Fp8TensorsWidenExactlyToBf16) {
  test::TempDir dir;
  std::string data;
  for (int b = 0; b < 256; ++b) data += static_cast<char>(b);
  data += data;
  const std::string header =
      R"({"e4m3":{"dtype":"F8_E4M3","shape":[16,16],"data_offsets":[0,256]},)"
      R"("e5m2":{"dtype":"F8_E5M2","shape":[256],"data_offsets":[256,512]}})";
  write_raw(dir.file("fp8.safetensors"), with_header(header, data));
  auto f = io::SafetensorsFile::open(dir.file("fp8.safetensors"));
  const auto e4m3 = f->get("e4m3"), e5m2 = f->get("e5m2");
  ASSERT_EQ(e4m3.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(e4m3.sizes(), (std::vector<int64_t>{16, 16}));
  const auto a = e4m3.reshape({-1}).to(torch::kFloat64), b = e5m2.to(torch::kFloat64);
  for (int byte = 0; byte < 256; ++byte) {
    const int sign = byte & 0x80 ? -1 : 1;
    {
      const int e = (byte >> 3) & 15, m = byte & 7;
      const double v = a[byte].item<double>();
      if (e == 15 && m == 7) {
        EXPECT_TRUE(std::isnan(v)) << byte;
      } else {
        const double want = e == 0 ? sign * m / 8.0 * std::ldexp(1.0, -6)
                                   : sign * (1 + m / 8.0) * std::ldexp(1.0, e - 7);
        EXPECT_EQ(v, want) << "e4m3 byte " << byte;
      }
    }
    {
      const int e = (byte >> 2) & 31, m = byte & 3;
      const double v = b[byte].item<double>();
      if (e == 31 && m != 0) {
        EXPECT_TRUE(std::isnan(v)) << byte;
      } else if (e == 31) {
        EXPECT_EQ(v, sign * std::numeric_limits<double>::infinity()) << byte;
      } else {
        const double want = e == 0 ? sign * m / 4.0 * std::ldexp(1.0, -14)
                                   : sign * (1 + m / 4.0) * std::ldexp(1.0, e - 15);
        EXPECT_EQ(v, want) << "e5m2 byte " << byte;
      }
    }
  }
  EXPECT_EQ(a[0x7e].item<double>(), 448.0);  // e4m3fn's largest
  EXPECT_EQ(b[0x7b].item<double>(), 57344.0);
}

TEST(Safetensors, RejectsBadFilesWithClearErrors) {
  test::TempDir dir;
  auto p = dir.file("bad.safetensors");
  write_raw(p, "");
  expect_format_error(p, "too short");
  write_raw(p, std::string("\x10\0\0", 3));
  expect_format_error(p, "too short");
  write_raw(p, with_header("{}", "", 1000));
  expect_format_error(p, "larger than the file");
  write_raw(p, with_header("{not json", ""));
  expect_format_error(p, "not valid JSON");
  write_raw(p, with_header("[1,2]", ""));
  expect_format_error(p, "not a JSON object");
  write_raw(p, with_header(R"({"x":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", "a"));
  expect_format_error(p, "unknown dtype 'F4'");
  write_raw(p, with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"));
  expect_format_error(p, "beyond the data section");
  write_raw(p,
            with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "abcdefgh"));
  expect_format_error(p, "need 12 bytes");
  // 2^62 elements of 8 bytes: the byte count overflows (it used to print a wrapped number).
  write_raw(
      p, with_header(R"({"x":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                     "abcdefgh"));
  expect_format_error(p, "need more than 2^64 bytes");
  // A tensor named twice: JSON would keep the later entry silently.
  write_raw(p, with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           "abcdefgh"));
  expect_format_error(p, "names 'x' more than once");
  write_raw(p,
            with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcdefgh"));
  expect_format_error(p, "reversed");
  write_raw(
      p,
      with_header(
          R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
          "abcdefgh"));
  expect_format_error(p, "overlapping");
  write_raw(p, with_header(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
  expect_format_error(p, "non-negative");
  write_raw(p, with_header(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"));
  expect_format_error(p, "shape");
  write_raw(p, with_header(R"({"__metadata__":{"a":1}})", ""));
  expect_format_error(p, "__metadata__");
  write_raw(
      p,
      with_header(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})",
                  "abcd"));
  expect_format_error(p, "tensor 'x'");
}

TEST(Safetensors, MissingFileIsAnIoError) {
  EXPECT_THROW(io::SafetensorsFile::open("/nonexistent/x.safetensors"), IoError);
}

TEST(Safetensors, UnknownTensorNameIsAnError) {
  test::TempDir dir;
  io::save_safetensors(dir.file("a.safetensors"), {{"x", torch::ones({1})}});
  auto f = io::SafetensorsFile::open(dir.file("a.safetensors"));
  EXPECT_THROW(f->get("y"), FormatError);
}

TEST(Safetensors, WriterIsAtomicAndLeavesNoTempFiles) {
  test::TempDir dir;
  io::save_safetensors(dir.file("a.safetensors"), {{"x", torch::ones({2})}});
  // A failing write (unsupported dtype) must leave the old file intact and no temp file.
  EXPECT_THROW(io::save_safetensors(dir.file("a.safetensors"),
                                    {{"x", torch::ones({2}, torch::kComplexFloat)}}),
               InvalidArgument);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++files;
  EXPECT_EQ(files, 1);
  EXPECT_TRUE(torch::equal(io::SafetensorsFile::open(dir.file("a.safetensors"))->get("x"),
                           torch::ones({2})));
  EXPECT_THROW(io::save_safetensors("/nonexistent-dir/a.safetensors", {{"x", torch::ones({1})}}),
               IoError);
}

// Streamed tensors are made one at a time as they are written; one that is not what the header
// declared fails the write and leaves nothing.
TEST(Safetensors, StreamedWriterMakesEachTensorWhenWritingIt) {
  test::TempDir dir;
  std::vector<std::string> made;
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, float value) {
    return io::SafetensorsTensorToWrite{name, torch::kBFloat16, shape, [&made, name, shape, value] {
                                          made.push_back(name);
                                          return torch::full(shape, value, torch::kBFloat16);
                                        }};
  };
  io::save_safetensors_streamed(dir.file("s.safetensors"),
                                {tensor("b", {2, 3}, 1.5f), tensor("a", {4}, -2.0f)});
  EXPECT_EQ(made, (std::vector<std::string>{"b", "a"}));
  const auto f = io::SafetensorsFile::open(dir.file("s.safetensors"));
  EXPECT_TRUE(torch::equal(f->get("b"), torch::full({2, 3}, 1.5f, torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(f->get("a"), torch::full({4}, -2.0f, torch::kBFloat16)));

  auto wrong = tensor("c", {2, 2}, 1.0f);
  wrong.shape = {5};
  const auto what = test::expect_throw<InvalidArgument>(
      [&] { io::save_safetensors_streamed(dir.file("t.safetensors"), {wrong}); });
  EXPECT_NE(what.find("'c' was declared"), std::string::npos) << what;
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.safetensors")));
}

// Thousands of random mutations of a valid file: every one must either load or throw one of
// our typed errors; anything else (crash, UB under the sanitizer build) fails the test.
TEST(Safetensors, FuzzedMutationsNeverCrash) {
  test::TempDir dir;
  auto good = dir.file("good.safetensors");
  io::save_safetensors(good,
                       {{"a", torch::randn({3, 4})},
                        {"b", torch::arange(5)},
                        {"c", torch::ones({2}, torch::kBFloat16)}},
                       {{"k", "v"}});
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(1234);
  auto p = dir.file("fuzz.safetensors");
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = bytes;
    int kind = iter % 4;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      if (m.empty()) break;
      size_t pos = rng() % m.size();
      if (kind == 0) m[pos] = static_cast<char>(rng());                   // byte flip
      if (kind == 1) m.resize(pos);                                       // truncation
      if (kind == 2 && pos < 8) m[pos] = static_cast<char>(rng());        // header length
      if (kind == 3) m.insert(pos, 1, "{}[],:\"0123456789"[rng() % 17]);  // JSON junk
    }
    write_raw(p, m);
    try {
      auto f = io::SafetensorsFile::open(p);
      for (const auto& n : f->names()) (void)f->get(n).sum();
      ++loaded;
    } catch (const diffuse::Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(loaded, 0);
}

}  // namespace test_safetensors
}  // namespace diffuse
