// GGUF reader: the whole file through GgufFile::open, then every tensor read (dequantized for
// block types) and its metadata strings looked up.
#include <cstdint>
#include <string>

#include "diffuse/errors.h"
#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = diffuse::fuzz::write_scratch(
      "input.gguf", std::string(reinterpret_cast<const char*>(data), size));
  try {
    auto file = diffuse::io::GgufFile::open(path);
    file->metadata_string("general.architecture");
    for (const auto& name : file->names())
      if (file->info(name).bytes <= (1u << 20)) file->get(name).sum();
  } catch (const diffuse::Error&) {
  }
  return 0;
}
