// PNG reader: decode_png on arbitrary bytes (pixel limit 4 MP, text chunks read).
#include <cstdint>
#include <map>
#include <string>

#include "diffuse/errors.h"
#include "diffuse/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> text;
  try {
    diffuse::decode_png(std::string(reinterpret_cast<const char*>(data), size), "fuzz", 1u << 22,
                        &text);
  } catch (const diffuse::Error&) {
  }
  return 0;
}
