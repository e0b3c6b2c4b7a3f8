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

// A golden set next to the default one (`name`), unless $`env` names another.
inline std::string sibling_golden_dir(const char* env, const std::string& name) {
  if (const char* v = std::getenv(env); v && *v) return v;
  std::filesystem::path p(DIFFUSE_DEFAULT_GOLDEN_DIR);
  if (!p.has_filename()) p = p.parent_path();
  return (p.parent_path() / name).string();
}

inline std::string hidream_golden_dir() {
  return sibling_golden_dir("DIFFUSE_HIDREAM_GOLDEN_DIR", "hidream-tiny");
}
inline std::string sdxl_golden_dir() {
  return sibling_golden_dir("DIFFUSE_SDXL_GOLDEN_DIR", "sdxl-tiny");
}
inline std::string flux_golden_dir() {
  return sibling_golden_dir("DIFFUSE_FLUX_GOLDEN_DIR", "flux-tiny");
}
inline std::string flux_kontext_golden_dir() {
  return sibling_golden_dir("DIFFUSE_FLUX_KONTEXT_GOLDEN_DIR", "flux-kontext-tiny");
}
inline std::string qwen_image_golden_dir() {
  return sibling_golden_dir("DIFFUSE_QWEN_IMAGE_GOLDEN_DIR", "qwen-image-tiny");
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
