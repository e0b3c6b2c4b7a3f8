#include "test_util.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

namespace diffuse::test {
namespace test_util {
// The engine uses every CPU for intra-op threads (device/cpu_threads.h). The test models are
// tiny: a second thread only adds synchronisation, and on a busy machine each parallel region
// waits for a descheduled thread (a 200x slow-down measured on the golden pipeline cases). The
// CLI processes the tests start inherit this too. An explicit setting wins.
const bool kOneThread = [] {
  setenv("DIFFUSE_THREADS", "1", /*overwrite=*/0);
  return true;
}();
}  // namespace test_util

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() /
          ("diffuse_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace diffuse::test
