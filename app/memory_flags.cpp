#include "memory_flags.h"

#include "pipeline/memory_plan.h"

namespace diffuse::app {

void add_max_memory_flag(CLI::App& app, std::string& value) {
  app.add_option("--max-memory", value,
                 "Plan the run for at most this much memory (24G, 16000M: a smaller card than "
                 "the one present); default: what the device has free. The plan is printed; a run "
                 "that cannot fit is refused before anything loads, saying what would fit");
}

int64_t max_memory_bytes(const std::string& value) {
  return value.empty() ? 0 : pipeline::parse_memory_size(value, "--max-memory");
}

}  // namespace diffuse::app
