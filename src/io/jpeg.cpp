// JPEG encoding in memory with libjpeg(-turbo), for the OpenAI API's output_format "jpeg".
// jpeglib.h uses size_t and FILE without including their headers.
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <csetjmp>
#include <cstdlib>
#include <memory>
#include <string>

#include "diffuse/errors.h"
#include "diffuse/image.h"

namespace diffuse {
namespace {

// libjpeg's default error handler exits the process; this one jumps back to the encoder with
// the library's message.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void on_jpeg_error(j_common_ptr info) {
  auto* err = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, err->message);
  std::longjmp(err->jump, 1);
}

}  // namespace

std::string encode_jpeg(const Image& image, int quality) {
  if (image.empty() || image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw InvalidArgument("encode_jpeg: the image is empty or its pixels do not match its size");
  if (quality < 0 || quality > 100)
    throw InvalidArgument("encode_jpeg: quality must be 0..100, got " + std::to_string(quality));
  jpeg_compress_struct info{};
  JpegError err{};
  info.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): libjpeg's type
  // Nothing with a destructor lives between setjmp and the calls that may jump back.
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&info);
    std::free(buffer);
    throw Error(std::string("encode_jpeg: libjpeg failed: ") + err.message);
  }
  jpeg_create_compress(&info);
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = static_cast<JDIMENSION>(image.width);
  info.image_height = static_cast<JDIMENSION>(image.height);
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  const size_t stride = static_cast<size_t>(image.width) * 3;
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<JSAMPLE*>(image.rgb.data() + info.next_scanline * stride);
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  return out;
}

}  // namespace diffuse
