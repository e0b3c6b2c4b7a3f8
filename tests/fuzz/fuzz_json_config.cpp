// JSON config readers: a config.json from arbitrary bytes, then every typed reader the model
// configs use, on every key it has.
#include <cstdint>
#include <string>

#include "diffuse/errors.h"
#include "fuzz_util.h"
#include "io/json_config.h"
#include "models/config_values.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace m = diffuse::models;
  const auto path = diffuse::fuzz::write_scratch(
      "config.json", std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto cfg = diffuse::io::JsonConfig::load(path);
    for (const auto& item : cfg.json().items()) {
      const std::string key = item.key();
      auto attempt = [](auto&& read) {
        try {
          read();
        } catch (const diffuse::Error&) {
        }
      };
      attempt([&] { m::read_int_in(cfg, key, 0, -1000, 1000); });
      attempt([&] { m::read_number_in(cfg, key, 0.0, -1e6, 1e6); });
      attempt([&] { m::read_positive_number(cfg, key, 1.0, 1e6); });
      attempt([&] { m::read_int_list(cfg, key); });
      attempt([&] { m::read_per_block_ints(cfg, key, 4, 1); });
      attempt([&] { m::read_per_block_bools(cfg, key, 4, false); });
      attempt([&] { m::read_string_list(cfg, key, {}); });
      attempt([&] { m::read_size(cfg, key, 8192); });
      attempt([&] { cfg.get_number(key, 0.0); });
    }
  } catch (const diffuse::Error&) {
  }
  return 0;
}
