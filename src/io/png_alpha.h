// A PNG held in memory with its alpha channel: what OpenAI's image edits need, whose mask
// marks the region to repaint by full transparency. Same limits and errors as decode_png.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "diffuse/image.h"

namespace diffuse {

// The image's colour, and in `alpha` one byte per pixel (row-major): its alpha channel or
// tRNS key, 255 everywhere when it has neither.
Image decode_png_with_alpha(const std::string& bytes, const std::string& what, uint64_t max_pixels,
                            std::vector<uint8_t>* alpha);

}  // namespace diffuse
