// Golden data sets (format: shared/golden/*/README.md): cases.json lists cases, each with a
// component, params, the tensors of its case file, and a tolerance. Nothing here knows a case
// name: runners are chosen by component and read everything else from the case.
#pragma once
#include <torch/types.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diffuse::io {
class SafetensorsFile;
}

namespace diffuse::verify {

struct GoldenCase {
  std::string name;
  std::string component;
  std::string file;  // absolute path of the case's safetensors file
  nlohmann::json params;
  nlohmann::json tolerance;
  nlohmann::json raw;  // the whole cases.json entry

  // Tolerance field as a number, or `fallback` if absent / not numeric.
  double tol(const std::string& key, double fallback) const;
};

struct GoldenSet {
  std::string dir;
  nlohmann::json index;
  std::vector<GoldenCase> cases;

  // Loads `dir`/cases.json. Throws IoError/FormatError naming the file: also for a set with no
  // cases, fields of the wrong type, and file names that leave the folder.
  static GoldenSet load(const std::string& dir);
  // Checks every file cases.json lists under "files" (size and sha256): FormatError "golden
  // file corrupted: ..." for the first that differs, so that a damaged reference is never
  // reported as an engine mismatch (or, worse, passes).
  void check_files() const;
  std::string model_dir() const;
  // The single-file checkpoint, or "" if the set has none.
  std::string single_file_checkpoint() const;
  const GoldenCase* find(const std::string& name) const;
};

// The tensors of one case file.
class CaseTensors {
 public:
  explicit CaseTensors(const std::string& path);
  bool has(const std::string& name) const;
  torch::Tensor get(const std::string& name) const;  // FormatError if absent
  // Names that start with `prefix`, e.g. "step." -> all per-step tensors.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;

 private:
  std::shared_ptr<io::SafetensorsFile> file_;
};

struct Comparison {
  bool passed = false;
  double max_abs_err = 0;
  std::string reason;  // empty when passed
};

// Element-wise |got - expected| <= atol + rtol * |expected| (after converting both to
// float64 on the CPU). Shape mismatch or non-finite values fail with a reason.
Comparison compare(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected,
                   double atol, double rtol);
// Exact comparison for integer tensors (token ids, timesteps).
Comparison compare_exact(const std::string& what, const torch::Tensor& got,
                         const torch::Tensor& expected);

struct CaseResult {
  std::string name;
  std::string component;
  bool passed = false;
  double max_abs_err = 0;
  std::string reason;
  std::vector<std::string> details;  // one line per compared tensor

  // Folds a comparison in: keeps the worst error, the first failure reason.
  void add(const std::string& what, const Comparison& c);
};

// A params entry that may be one string or a list of strings ("prompt"), as a list.
std::vector<std::string> string_list(const nlohmann::json& j);

// Where the golden data lives: $DIFFUSE_GOLDEN_DIR if set, else `fallback`.
std::string golden_dir_from_env(const std::string& fallback);

}  // namespace diffuse::verify
