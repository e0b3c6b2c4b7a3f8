// safetensors reader: the whole file (8-byte length, JSON header, data) through
// SafetensorsFile::open, then every tensor read.
#include <cstdint>
#include <string>

#include "diffuse/errors.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = diffuse::fuzz::write_scratch(
      "input.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  try {
    auto file = diffuse::io::SafetensorsFile::open(path);
    for (const auto& name : file->names()) file->get(name).sum();
  } catch (const diffuse::Error&) {
  }
  return 0;
}
