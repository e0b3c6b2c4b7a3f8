// PNG through libpng. libpng reports errors by longjmp; every libpng call sits in a function
// whose only locals are trivially destructible, and errors are rethrown as typed exceptions
// after the jump, so no C++ destructor is skipped.
#include <png.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/png_alpha.h"

namespace diffuse {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

// The largest image any reader accepts (2^28 pixels, 768 MiB of RGB).
constexpr uint64_t kMaxPngPixels = 1ull << 28;
// The largest ancillary chunk (text, ICC profile...) and decompressed text read: 16 MiB.
constexpr png_alloc_size_t kMaxChunkBytes = png_alloc_size_t{16} << 20;

struct ErrorBuffer {
  char message[256] = {0};
  bool from_libpng = true;  // false: one of our own checks (size limits)
};

void on_error(png_structp png, png_const_charp msg) {
  auto* err = static_cast<ErrorBuffer*>(png_get_error_ptr(png));
  if (err) std::snprintf(err->message, sizeof(err->message), "%s", msg);
  png_longjmp(png, 1);
}
// libpng reports a chunk longer than png_set_chunk_malloc_max as a *benign* error, which a read
// struct turns into a warning, and then allocates the chunk's declared length anyway (1.5 GiB
// for a 132-byte file). That one is an error here; other benign errors (an sRGB profile libpng
// dislikes, say) stay warnings so that real-world files still load.
void on_warning(png_structp png, png_const_charp msg) {
  if (msg && std::strstr(msg, "chunk data is too large")) on_error(png, msg);
}

// Where libpng reads from or writes to: a FILE, or a memory buffer.
struct MemoryReader {
  const unsigned char* data;
  size_t size;
  size_t pos;
};

void read_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* r = static_cast<MemoryReader*>(png_get_io_ptr(png));
  if (length > r->size - r->pos) png_error(png, "truncated PNG data");
  std::memcpy(out, r->data + r->pos, length);
  r->pos += length;
}

void write_memory(png_structp png, png_bytep data, png_size_t length) {
  static_cast<std::string*>(png_get_io_ptr(png))
      ->append(reinterpret_cast<const char*>(data), length);
}
void flush_memory(png_structp) {}

struct PngIo {
  FILE* file = nullptr;            // when set
  MemoryReader* reader = nullptr;  // else decode reads this
  std::string* writer = nullptr;   // else encode appends here
};

void attach_io(png_structp png, const PngIo& io, bool reading) {
  if (io.file)
    png_init_io(png, io.file);
  else if (reading)
    png_set_read_fn(png, io.reader, read_memory);
  else
    png_set_write_fn(png, io.writer, write_memory, flush_memory);
}

// Bytes of input (the file's size, or the buffer's); 0 if unknown.
uint64_t input_bytes(const PngIo& io) {
  if (io.reader) return io.reader->size;
  struct stat st {};
  if (io.file && ::fstat(::fileno(io.file), &st) == 0 && S_ISREG(st.st_mode))
    return static_cast<uint64_t>(st.st_size);
  return 0;
}

// Returns false (with err->message set) if libpng failed. Images of more than max_pixels are
// refused from the header, before the pixel buffer is allocated.
// `alpha` (optional) receives one byte per pixel: the image's alpha, or 255 where it has none.
bool decode(const PngIo& io, ErrorBuffer* err, Image* out, std::vector<png_bytep>* rows,
            std::map<std::string, std::string>* text, uint64_t max_pixels,
            std::vector<uint8_t>* alpha = nullptr) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, err, on_error, on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  attach_io(png, io, true);
  // libpng allocates a chunk's declared length, and inflates compressed text, before it knows
  // the data is there: bounded so that a few bytes cannot make it allocate gigabytes.
  png_set_chunk_malloc_max(png, kMaxChunkBytes);
  png_set_chunk_cache_max(png, 1000);
  png_read_info(png, info);
  png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (w == 0 || h == 0 || static_cast<uint64_t>(w) * h > max_pixels) {
    err->from_libpng = false;
    std::snprintf(err->message, sizeof(err->message),
                  "image size %ux%u is not supported (at most %llu pixels)", w, h,
                  static_cast<unsigned long long>(max_pixels));
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  // Deflate compresses at most 1032:1, so pixel rows larger than that much of the input are
  // a lie of the header (a few hundred bytes declaring 16384x16384): refused before the
  // buffer is allocated, not after.
  const uint64_t row_bytes = static_cast<uint64_t>(h) * (png_get_rowbytes(png, info) + 1);
  const uint64_t input = input_bytes(io);
  if (input > 0 && row_bytes > input * 1032 + (64u << 10)) {
    err->from_libpng = false;
    std::snprintf(err->message, sizeof(err->message),
                  "truncated or corrupt PNG: its header declares %ux%u (%llu bytes of pixel "
                  "rows), more than %llu bytes of data can hold",
                  w, h, static_cast<unsigned long long>(row_bytes),
                  static_cast<unsigned long long>(input));
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (depth == 16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  const size_t channels = alpha ? 4 : 3;
  if (alpha) {
    // RGBA whatever the file holds: a tRNS colour key becomes alpha, no alpha becomes 255.
    if (png_get_valid(png, info, PNG_INFO_tRNS))
      png_set_tRNS_to_alpha(png);
    else if (!(color & PNG_COLOR_MASK_ALPHA))
      png_set_filler(png, 0xFF, PNG_FILLER_AFTER);
  } else {
    if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  }
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(w) * channels) {
    std::snprintf(err->message, sizeof(err->message), "unexpected pixel layout after conversion");
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  out->width = static_cast<int>(w);
  out->height = static_cast<int>(h);
  std::vector<uint8_t> rgba;
  auto& pixels = alpha ? rgba : out->rgb;
  pixels.assign(static_cast<size_t>(w) * h * channels, 0);
  rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y)
    (*rows)[y] = pixels.data() + static_cast<size_t>(y) * w * channels;
  png_read_image(png, rows->data());
  png_read_end(png, info);
  if (alpha) {
    const size_t n = static_cast<size_t>(w) * h;
    out->rgb.resize(n * 3);
    alpha->resize(n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < 3; ++c) out->rgb[i * 3 + c] = rgba[i * 4 + c];
      (*alpha)[i] = rgba[i * 4 + 3];
    }
  }
  if (text) {
    png_textp chunks = nullptr;
    int n = png_get_text(png, info, &chunks, nullptr);
    for (int i = 0; i < n; ++i)
      (*text)[chunks[i].key] = std::string(chunks[i].text, chunks[i].text_length);
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// libpng's own complaints ("Read Error", "IDAT: CRC error") mean the data is cut or damaged:
// said so, with the size that was there to read.
FormatError decode_error(const std::string& what, const ErrorBuffer& err, uint64_t size) {
  const std::string detail = err.message[0] ? err.message : "libpng error";
  if (!err.from_libpng) return FormatError("cannot decode " + what + ": " + detail);
  return FormatError("truncated or corrupt PNG: " + what + " (" + std::to_string(size) +
                     " bytes): " + detail);
}

bool encode(const PngIo& io, ErrorBuffer* err, const Image& image,
            const std::vector<png_text>& text) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, err, on_error, on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  attach_io(png, io, false);
  png_set_IHDR(png, info, image.width, image.height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!text.empty())
    png_set_text(png, info, const_cast<png_textp>(text.data()), static_cast<int>(text.size()));
  png_write_info(png, info);
  for (int y = 0; y < image.height; ++y)
    png_write_row(
        png, const_cast<png_bytep>(image.rgb.data() + static_cast<size_t>(y) * image.width * 3));
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

Image read_png_impl(const std::string& path, std::map<std::string, std::string>* text) {
  io::require_regular_file(path, "image");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw IoError("cannot open image '" + path + "': " + std::strerror(errno));
  unsigned char sig[8] = {0};
  if (std::fread(sig, 1, 8, f.get()) != 8 || png_sig_cmp(sig, 0, 8) != 0)
    throw FormatError("'" + path + "' is not a PNG file (only PNG images are supported)");
  std::rewind(f.get());
  ErrorBuffer err;
  Image image;
  std::vector<png_bytep> rows;
  PngIo io;
  io.file = f.get();
  if (!decode(io, &err, &image, &rows, text, kMaxPngPixels))
    throw decode_error("PNG '" + path + "'", err, input_bytes(io));
  return image;
}

void check_image(const Image& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw InvalidArgument("write_png: image is " + std::to_string(image.width) + "x" +
                          std::to_string(image.height) + " with " +
                          std::to_string(image.rgb.size()) + " bytes, expected width*height*3");
}

std::vector<png_text> text_chunks(const std::map<std::string, std::string>& text) {
  std::vector<png_text> chunks;
  for (const auto& [k, v] : text) {
    png_text t{};
    t.compression = PNG_TEXT_COMPRESSION_NONE;
    t.key = const_cast<char*>(k.c_str());
    t.text = const_cast<char*>(v.c_str());
    t.text_length = v.size();
    chunks.push_back(t);
  }
  return chunks;
}

}  // namespace

Image read_png(const std::string& path) {
  return read_png_impl(path, nullptr);
}

std::map<std::string, std::string> read_png_text(const std::string& path) {
  std::map<std::string, std::string> text;
  read_png_impl(path, &text);
  return text;
}

void write_png(const std::string& path, const Image& image,
               const std::map<std::string, std::string>& text) {
  check_image(image);
  const auto chunks = text_chunks(text);
  io::AtomicFile file(path);
  {
    FilePtr f(std::fopen(file.temp_path().c_str(), "wb"));
    if (!f) throw IoError("cannot write '" + path + "': " + std::strerror(errno));
    ErrorBuffer err;
    PngIo io;
    io.file = f.get();
    if (!encode(io, &err, image, chunks))
      throw IoError("cannot encode PNG '" + path +
                    "': " + (err.message[0] ? err.message : "libpng error"));
    if (std::fflush(f.get()) != 0)
      throw IoError("cannot write '" + path + "': " + std::strerror(errno));
  }
  file.commit();
}

std::string encode_png(const Image& image, const std::map<std::string, std::string>& text) {
  check_image(image);
  const auto chunks = text_chunks(text);
  std::string out;
  ErrorBuffer err;
  PngIo io;
  io.writer = &out;
  if (!encode(io, &err, image, chunks))
    throw Error(std::string("cannot encode PNG: ") +
                (err.message[0] ? err.message : "libpng error"));
  return out;
}

namespace {

Image decode_png_bytes(const std::string& bytes, const std::string& what, uint64_t max_pixels,
                       std::map<std::string, std::string>* text, std::vector<uint8_t>* alpha) {
  if (bytes.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) != 0)
    throw FormatError(what + " is not a PNG image (only PNG images are supported)");
  MemoryReader reader{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0};
  PngIo io;
  io.reader = &reader;
  ErrorBuffer err;
  Image image;
  std::vector<png_bytep> rows;
  if (!decode(io, &err, &image, &rows, text, std::min(max_pixels, kMaxPngPixels), alpha))
    throw decode_error(what, err, bytes.size());
  return image;
}

}  // namespace

Image decode_png_with_alpha(const std::string& bytes, const std::string& what, uint64_t max_pixels,
                            std::vector<uint8_t>* alpha) {
  return decode_png_bytes(bytes, what, max_pixels, nullptr, alpha);
}

Image decode_png(const std::string& bytes, const std::string& what, uint64_t max_pixels,
                 std::map<std::string, std::string>* text) {
  return decode_png_bytes(bytes, what, max_pixels, text, nullptr);
}

}  // namespace diffuse
