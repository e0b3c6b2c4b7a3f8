// An 8-bit RGB image, row-major, 3 bytes per pixel: the unit the public API deals in.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace diffuse {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3 bytes

  bool empty() const { return width == 0 || height == 0; }
};

// Reads a PNG (any bit depth / colour type; alpha is dropped, grey expanded). Throws IoError if
// the file cannot be opened, FormatError if it is not a valid PNG.
Image read_png(const std::string& path);

// Writes an RGB PNG atomically (temp file + rename) with the given tEXt chunks
// (e.g. {"parameters": "prompt: ...; seed: 42"}). Throws IoError on failure.
void write_png(const std::string& path, const Image& image,
               const std::map<std::string, std::string>& text = {});

// The same PNG file as bytes in memory (HTTP responses).
std::string encode_png(const Image& image, const std::map<std::string, std::string>& text = {});

// JPEG (libjpeg, 4:2:0) and WebP (libwebp; quality 100 is lossless) files as bytes in memory, for
// clients that ask for them (OpenAI's output_format). quality: 0..100 (InvalidArgument else).
std::string encode_jpeg(const Image& image, int quality);
std::string encode_webp(const Image& image, int quality);

// A PNG held in memory (an upload). `what` names it in errors ("init_images[0]"). Images of
// more than max_pixels are refused from the header, before any pixel is allocated; text, when
// given, receives the tEXt chunks.
Image decode_png(const std::string& bytes, const std::string& what, uint64_t max_pixels,
                 std::map<std::string, std::string>* text = nullptr);

// The tEXt chunks of a PNG (for tests and tools).
std::map<std::string, std::string> read_png_text(const std::string& path);

}  // namespace diffuse
