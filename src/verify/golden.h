// Golden data sets (format: shared/golden/*/README.md): cases.json lists cases, each with a
// component, params, the tensors of its case file, and a tolerance. Nothing here knows a case
// name: runners are chosen by component and read everything else from the case.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace diffuse::io {
class SafetensorsFile;
}

namespace diffuse::verify {

// A file's size and SHA-256 as cases.json's "files" lists them.
struct ListedFile {
  std::string sha256;
  std::optional<uint64_t> bytes;
};

struct GoldenCase {
  std::string name;
  std::string component;
  std::string file;                  // absolute path of the case's safetensors file
  std::optional<ListedFile> listed;  // the case file's "files" entry (absent if the set has none)
  std::string where;                 // "<dir>/cases.json: case '<name>'", for messages
  nlohmann::json params;             // an object
  nlohmann::json tolerance;          // an object
  nlohmann::json raw;                // the whole cases.json entry

  // Tolerance field, or `fallback` if absent; FormatError unless a finite number >= 0.
  double tol(const std::string& key, double fallback) const;
  // params[key] as T (bool, an integer type, double, std::string, or nlohmann::json for an
  // object), or `fallback` if absent. A value of another type is a FormatError naming
  // cases.json, the case, the key, the value and the type expected, never a silent default.
  template <typename T>
  T param(const std::string& key, T fallback) const;
  // params[key] as one string or a list of strings (prompts); empty if absent or null.
  std::vector<std::string> param_strings(const std::string& key) const;
  [[noreturn]] void bad_param(const std::string& key, const char* expected) const;
};

struct GoldenSet {
  std::string dir;
  nlohmann::json index;
  std::vector<GoldenCase> cases;
  std::map<std::string, ListedFile> files;  // "files", by path relative to `dir`

  // Loads `dir`/cases.json. Throws IoError/FormatError naming the file: also for a set with no
  // cases, fields of the wrong type, and paths that leave the folder.
  static GoldenSet load(const std::string& dir);
  // `relative` (a path cases.json gives) inside the set's folder; FormatError naming
  // cases.json and `what` if it is absolute or has "..".
  std::string path_inside(const std::string& relative, const std::string& what) const;
  // Checks the size and SHA-256 of every listed file except the case files (CaseTensors
  // checks those as it reads them): FormatError "golden file corrupted: ..." for the first
  // that differs, so that a damaged model is never reported as an engine mismatch.
  void check_model_files() const;
  std::string model_dir() const;
  // The model a case runs: its params.model_dir (a second model of the set, e.g. a refiner),
  // else model_dir().
  std::string model_dir(const GoldenCase& c) const;
  // The single-file checkpoint, or "" if the set has none.
  std::string single_file_checkpoint() const;
  const GoldenCase* find(const std::string& name) const;
};

// The tensors of one case file.
class CaseTensors {
 public:
  // Checks the file against its "files" entry first: FormatError "golden file corrupted:
  // <file>: sha256 <got>, cases.json says <want>" (a damaged reference, not an engine mismatch).
  explicit CaseTensors(const GoldenCase& c);
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
  std::string note;    // what was measured, for the case's details (compare_relative_rms)
};

// Element-wise |got - expected| <= atol + rtol * |expected| (after converting both to
// float64 on the CPU). Shape mismatch or non-finite values fail with a reason.
Comparison compare(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected,
                   double atol, double rtol);
// Relative RMS error ||got - expected|| / ||expected|| <= max_relative (float64): how far a
// quantization round trip may move a network's output, where one value's error says little
// (an MoE token routed to another expert after a tie moved). Shape mismatch or non-finite
// values fail with a reason; max_abs_err is reported as well.
Comparison compare_relative_rms(const std::string& what, const torch::Tensor& got,
                                const torch::Tensor& expected, double max_relative);
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

template <typename T>
T GoldenCase::param(const std::string& key, T fallback) const {
  const auto it = params.find(key);
  if (it == params.end()) return fallback;
  const nlohmann::json& v = *it;
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad_param(key, "true or false");
  } else if constexpr (std::is_integral_v<T>) {
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= uint64_t{std::numeric_limits<T>::max()}
                          : v.is_number_integer() &&
                                v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                v.get<int64_t>() <= int64_t{std::numeric_limits<T>::max()};
    if (!fits) bad_param(key, "an integer");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) bad_param(key, "a number");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) bad_param(key, "a string");
  } else {
    static_assert(std::is_same_v<T, nlohmann::json>, "param<T>: unsupported type");
    if (!v.is_object()) bad_param(key, "an object");
  }
  return v.get<T>();
}

// Where the golden data lives: $DIFFUSE_GOLDEN_DIR if set, else `fallback`.
std::string golden_dir_from_env(const std::string& fallback);

}  // namespace diffuse::verify
