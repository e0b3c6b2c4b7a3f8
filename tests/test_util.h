// Helpers shared by the tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "verify/golden.h"

namespace diffuse::test {

// The golden set under test: $DIFFUSE_GOLDEN_DIR or the shared sd21-tiny set.
inline std::string golden_dir() {
  return verify::golden_dir_from_env(DIFFUSE_DEFAULT_GOLDEN_DIR);
}

// The HiDream golden set: $DIFFUSE_HIDREAM_GOLDEN_DIR, else the hidream-tiny set next to the
// default golden set.
inline std::string hidream_golden_dir() {
  if (const char* env = std::getenv("DIFFUSE_HIDREAM_GOLDEN_DIR"); env && *env) return env;
  std::filesystem::path p(DIFFUSE_DEFAULT_GOLDEN_DIR);
  if (!p.has_filename()) p = p.parent_path();
  return (p.parent_path() / "hidream-tiny").string();
}

// The SDXL golden set: $DIFFUSE_SDXL_GOLDEN_DIR, else the sdxl-tiny set next to the default
// golden set.
inline std::string sdxl_golden_dir() {
  if (const char* env = std::getenv("DIFFUSE_SDXL_GOLDEN_DIR"); env && *env) return env;
  std::filesystem::path p(DIFFUSE_DEFAULT_GOLDEN_DIR);
  if (!p.has_filename()) p = p.parent_path();
  return (p.parent_path() / "sdxl-tiny").string();
}

// The golden set's diffusers model folder.
inline std::string golden_model_dir() {
  return verify::GoldenSet::load(golden_dir()).model_dir();
}

// Runs `f`, which must throw E; returns the message (and records a failure if nothing or
// something else was thrown).
template <typename E, typename F>
std::string expect_throw(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected exception not thrown";
  return "";
}

// A whole file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);

// A fresh empty folder under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace diffuse::test
