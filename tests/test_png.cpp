#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "test_util.h"

namespace diffuse {
namespace test_png {

Image gradient(int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>(i * 7);
  return img;
}

TEST(Png, WritesANameAtTheFileSystemLimit) {
  // 250 + ".png" = 254 characters: legal, although the temporary name must be shortened.
  test::TempDir dir;
  const std::string name = std::string(250, 'a') + ".png";
  write_png(dir.file(name), gradient(4, 3));
  EXPECT_EQ(read_png(dir.file(name)).width, 4);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(Png, RoundTripsPixelsAndText) {
  test::TempDir dir;
  auto img = gradient(13, 7);
  write_png(dir.file("a.png"), img,
            {{"parameters", "a cat; Seed: 42"}, {"diffuse", "{\"seed\":42}"}});
  auto back = read_png(dir.file("a.png"));
  EXPECT_EQ(back.width, 13);
  EXPECT_EQ(back.height, 7);
  EXPECT_EQ(back.rgb, img.rgb);
  auto text = read_png_text(dir.file("a.png"));
  EXPECT_EQ(text.at("parameters"), "a cat; Seed: 42");
  EXPECT_EQ(text.at("diffuse"), "{\"seed\":42}");
}

TEST(Png, BadFilesGiveClearErrors) {
  test::TempDir dir;
  EXPECT_THROW(read_png(dir.file("missing.png")), IoError);
  {
    std::ofstream out(dir.file("text.png"));
    out << "this is not a png";
  }
  try {
    read_png(dir.file("text.png"));
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("not a PNG"), std::string::npos);
  }
  // A truncated PNG: valid signature, cut in the middle.
  write_png(dir.file("full.png"), gradient(64, 64));
  std::ifstream in(dir.file("full.png"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  {
    std::ofstream out(dir.file("cut.png"), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  const auto cut = test::expect_throw<FormatError>([&] { read_png(dir.file("cut.png")); });
  EXPECT_NE(cut.find("truncated or corrupt PNG"), std::string::npos) << cut;
  EXPECT_NE(cut.find("cut.png"), std::string::npos) << cut;
  EXPECT_NE(cut.find(std::to_string(bytes.size() / 2) + " bytes"), std::string::npos) << cut;
}

// CRC-32 of a PNG chunk (type + data), to forge a consistent header.
uint32_t png_crc(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

// The process's peak resident memory so far (getrusage), in KiB.
int64_t peak_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void put_be32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xFF);
}

// Found by fuzz_png: a tEXt chunk declaring 1.5 GiB made libpng allocate that much before
// reading it. png_set_chunk_malloc_max alone did not stop it (libpng reports the oversized chunk
// as a benign error, a warning when reading, and allocates anyway); the reader now treats that
// report as an error. The input also stays in the fuzz corpus
// (tests/fuzz/corpus/png/oversize_text_chunk.png).
TEST(Png, AChunkDeclaringGigabytesIsAClearErrorWithoutAllocatingIt) {
  std::string png = encode_png(gradient(4, 4));
  std::string text_chunk = std::string("\0\0\0\0tEXt", 8) + "parameters";
  put_be32(text_chunk, 0, 0x60000000u);
  const std::string forged = png.substr(0, 33) + text_chunk + png.substr(33);
  const int64_t peak_before = peak_rss_kib();
  const auto msg =
      test::expect_throw<FormatError>([&] { decode_png(forged, "forged", 1ull << 40); });
  EXPECT_NE(msg.find("truncated or corrupt PNG: forged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chunk data is too large"), std::string::npos) << msg;
  // The process's peak grew by far less than the 1.5 GiB the chunk declares.
  EXPECT_LT(peak_rss_kib() - peak_before, 256 * 1024);
}

TEST(Png, HeaderDeclaringMorePixelsThanTheDataCanHoldIsRefusedBeforeDecoding) {
  // A real 16x16 PNG whose IHDR (with a valid CRC) claims 16384x16384: a few hundred bytes
  // that would otherwise make the reader allocate 768 MiB before noticing.
  std::string png = encode_png(gradient(16, 16));
  ASSERT_EQ(png.substr(12, 4), "IHDR");
  put_be32(png, 16, 16384);
  put_be32(png, 20, 16384);
  put_be32(png, 29, png_crc(png.substr(12, 17)));
  const auto msg = test::expect_throw<FormatError>([&] { decode_png(png, "forged", 1ull << 40); });
  EXPECT_NE(msg.find("16384x16384"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than " + std::to_string(png.size()) + " bytes"), std::string::npos)
      << msg;
  test::TempDir dir;
  {
    std::ofstream out(dir.file("forged.png"), std::ios::binary);
    out << png;
  }
  EXPECT_THROW(read_png(dir.file("forged.png")), FormatError);
}

TEST(Png, WriteFailuresLeaveNoFile) {
  test::TempDir dir;
  Image bad;
  bad.width = 4;
  bad.height = 4;
  bad.rgb.resize(5);
  EXPECT_THROW(write_png(dir.file("bad.png"), bad), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.png")));
  EXPECT_THROW(write_png(dir.file("no/such/dir/x.png"), gradient(2, 2)), IoError);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++files;
  EXPECT_EQ(files, 0);
}

}  // namespace test_png
}  // namespace diffuse
