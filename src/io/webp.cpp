// WebP encoding in memory with libwebp, for the OpenAI API's output_format "webp".
#include <webp/encode.h>

#include <string>

#include "diffuse/errors.h"
#include "diffuse/image.h"

namespace diffuse {

std::string encode_webp(const Image& image, int quality) {
  if (image.empty() || image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw InvalidArgument("encode_webp: the image is empty or its pixels do not match its size");
  if (quality < 0 || quality > 100)
    throw InvalidArgument("encode_webp: quality must be 0..100, got " + std::to_string(quality));
  if (image.width > WEBP_MAX_DIMENSION || image.height > WEBP_MAX_DIMENSION)
    throw InvalidArgument("encode_webp: WebP images are at most " +
                          std::to_string(WEBP_MAX_DIMENSION) + " pixels a side, got " +
                          std::to_string(image.width) + "x" + std::to_string(image.height));
  uint8_t* buffer = nullptr;
  // Quality 100 is lossless: what OpenAI's output_compression 100 (its default) promises.
  const size_t size = quality == 100
                          ? WebPEncodeLosslessRGB(image.rgb.data(), image.width, image.height,
                                                  image.width * 3, &buffer)
                          : WebPEncodeRGB(image.rgb.data(), image.width, image.height,
                                          image.width * 3, static_cast<float>(quality), &buffer);
  if (size == 0) {
    WebPFree(buffer);
    throw Error("encode_webp: libwebp could not encode a " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " image");
  }
  std::string out(reinterpret_cast<const char*>(buffer), size);
  WebPFree(buffer);
  return out;
}

}  // namespace diffuse
