#include "verify/golden.h"

#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "diffuse/errors.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace fs = std::filesystem;

namespace diffuse::verify {
namespace {

// Paths compare equal however cases.json spells them ("./cases/a" and "cases/a").
std::string normal(const std::string& relative) {
  return fs::path(relative).lexically_normal().generic_string();
}

void check_listed_file(const std::string& path, const ListedFile& want) {
  if (!fs::exists(path))
    throw FormatError("golden file missing: " + path + " (listed in cases.json 'files')");
  io::require_regular_file(path, "golden file");
  if (want.bytes && fs::file_size(path) != *want.bytes)
    throw FormatError("golden file corrupted: " + path + ": " +
                      std::to_string(fs::file_size(path)) + " bytes, cases.json says " +
                      std::to_string(*want.bytes));
  const std::string got = io::sha256_file_hex(path);
  if (got != want.sha256)
    throw FormatError("golden file corrupted: " + path + ": sha256 " + got + ", cases.json says " +
                      want.sha256);
}

std::map<std::string, ListedFile> parse_files(const GoldenSet& set, const std::string& source) {
  std::map<std::string, ListedFile> out;
  if (!set.index.contains("files")) return out;
  if (!set.index["files"].is_object())
    throw FormatError(source + ": 'files' is " + set.index["files"].dump().substr(0, 80) +
                      ", expected an object path -> {bytes, sha256}");
  for (const auto& [name, entry] : set.index["files"].items()) {
    set.path_inside(name, "files entry");
    ListedFile f;
    if (entry.is_object() && entry.contains("sha256") && entry["sha256"].is_string())
      f.sha256 = entry["sha256"].get<std::string>();
    for (auto& ch : f.sha256) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (f.sha256.size() != 64 ||
        f.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw FormatError(source + ": files['" + name + "'] is " + entry.dump().substr(0, 120) +
                        ", expected {\"sha256\": 64 hex digits, \"bytes\": size}");
    if (entry.contains("bytes")) {
      if (!entry["bytes"].is_number_unsigned())
        throw FormatError(source + ": files['" + name + "'].bytes is " + entry["bytes"].dump() +
                          ", expected a size in bytes");
      f.bytes = entry["bytes"].get<uint64_t>();
    }
    out[normal(name)] = f;
  }
  return out;
}

}  // namespace

double GoldenCase::tol(const std::string& key, double fallback) const {
  const auto it = tolerance.find(key);
  if (it == tolerance.end()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    throw FormatError(where + ": tolerance." + key + " is " + it->dump().substr(0, 80) +
                      ", expected a number >= 0");
  return it->get<double>();
}

void GoldenCase::bad_param(const std::string& key, const char* expected) const {
  throw FormatError(where + ": params." + key + " is " + params[key].dump().substr(0, 80) +
                    ", expected " + expected);
}

std::vector<std::string> GoldenCase::param_strings(const std::string& key) const {
  const auto it = params.find(key);
  // null: the reference pipeline got None (SDXL: no negative prompt, not the empty one).
  if (it == params.end() || it->is_null()) return {};
  bool ok = it->is_string() || it->is_array();
  if (it->is_array())
    for (const auto& s : *it) ok = ok && s.is_string();
  if (!ok) bad_param(key, "a string or a list of strings");
  return string_list(*it);
}

GoldenSet GoldenSet::load(const std::string& dir) {
  std::string path = (fs::path(dir) / "cases.json").string();
  if (!fs::exists(path)) throw IoError("golden set '" + dir + "' has no cases.json");
  auto cfg = io::JsonConfig::load(path);
  GoldenSet set;
  set.dir = dir;
  set.index = cfg.json();
  if (!set.index.is_object()) throw FormatError(path + ": expected a JSON object");
  if (!set.index.contains("cases") || !set.index["cases"].is_array())
    throw FormatError(path + ": missing array 'cases'");
  if (set.index["cases"].empty())
    throw FormatError(path + ": 'cases' is empty: a golden set without cases verifies nothing");
  for (const char* key : {"model_dir", "single_file_checkpoint"})
    if (set.index.contains(key)) {
      if (!set.index[key].is_string())
        throw FormatError(path + ": '" + key + "' is " + set.index[key].dump().substr(0, 80) +
                          ", expected a path inside the folder");
      set.path_inside(set.index[key].get<std::string>(), key);
    }
  set.files = parse_files(set, path);
  for (const auto& c : set.index["cases"]) {
    GoldenCase gc;
    if (!c.is_object()) throw FormatError(path + ": every case must be an object");
    for (const char* key : {"name", "component", "file"})
      if (!c.contains(key) || !c[key].is_string())
        throw FormatError(path +
                          ": every case needs string fields 'name', 'component' and "
                          "'file' (case: " +
                          c.dump().substr(0, 120) + ")");
    gc.name = c["name"].get<std::string>();
    if (set.find(gc.name)) throw FormatError(path + ": two cases are named '" + gc.name + "'");
    gc.where = path + ": case '" + gc.name + "'";
    gc.component = c["component"].get<std::string>();
    const std::string file = c["file"].get<std::string>();
    gc.file = set.path_inside(file, "case '" + gc.name + "' file");
    if (!set.files.empty()) {
      const auto it = set.files.find(normal(file));
      if (it == set.files.end())
        throw FormatError(gc.where + ": file '" + file +
                          "' is not listed in 'files' (no sha256 to check it against)");
      gc.listed = it->second;
    }
    for (const char* key : {"params", "tolerance"})
      if (c.contains(key) && !c[key].is_object())
        throw FormatError(gc.where + ": '" + key + "' is " + c[key].dump().substr(0, 80) +
                          ", expected an object");
    gc.params = c.value("params", nlohmann::json::object());
    gc.tolerance = c.value("tolerance", nlohmann::json::object());
    gc.raw = c;
    set.cases.push_back(std::move(gc));
  }
  return set;
}

std::string GoldenSet::path_inside(const std::string& relative, const std::string& what) const {
  io::require_inside_folder(relative, (fs::path(dir) / "cases.json").string(), what);
  return (fs::path(dir) / relative).string();
}

void GoldenSet::check_model_files() const {
  std::set<std::string> case_files;
  for (const auto& c : cases) case_files.insert(normal(c.raw["file"].get<std::string>()));
  for (const auto& [name, listed] : files)
    if (!case_files.count(name)) check_listed_file(path_inside(name, "files entry"), listed);
}

std::string GoldenSet::model_dir() const {
  return path_inside(index.value("model_dir", std::string("model")), "model_dir");
}

std::string GoldenSet::model_dir(const GoldenCase& c) const {
  if (!c.params.contains("model_dir")) return model_dir();
  return path_inside(c.param("model_dir", std::string()), c.where + " params.model_dir");
}

std::string GoldenSet::single_file_checkpoint() const {
  if (!index.contains("single_file_checkpoint")) return "";
  return path_inside(index["single_file_checkpoint"].get<std::string>(), "single_file_checkpoint");
}

const GoldenCase* GoldenSet::find(const std::string& name) const {
  for (const auto& c : cases)
    if (c.name == name) return &c;
  return nullptr;
}

namespace {

std::shared_ptr<io::SafetensorsFile> open_case_file(const GoldenCase& c) {
  // Hashed before parsing, so that damage anywhere (also in the header) reads as such.
  if (c.listed) check_listed_file(c.file, *c.listed);
  return io::SafetensorsFile::open(c.file);
}

}  // namespace

CaseTensors::CaseTensors(const GoldenCase& c) : file_(open_case_file(c)) {}

bool CaseTensors::has(const std::string& name) const {
  return file_->contains(name);
}

torch::Tensor CaseTensors::get(const std::string& name) const {
  if (!file_->contains(name))
    throw FormatError(file_->path() + ": case has no tensor '" + name + "'");
  return file_->get(name);
}

std::vector<std::string> CaseTensors::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& n : file_->names())
    if (n.compare(0, prefix.size(), prefix) == 0) out.push_back(n);
  return out;
}

namespace {

// Both tensors in float64 on the CPU, or false with `c` failed (shapes differ, or the result
// holds NaN/Inf) or passed (nothing to compare).
bool float64_pair(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected,
                  Comparison& c, torch::Tensor& g, torch::Tensor& e) {
  if (got.sizes() != expected.sizes()) {
    c.reason =
        what + ": shape " + c10::str(got.sizes()) + ", expected " + c10::str(expected.sizes());
    c.max_abs_err = std::numeric_limits<double>::infinity();
    return false;
  }
  g = got.detach().to(torch::kCPU, torch::kFloat64);
  e = expected.detach().to(torch::kCPU, torch::kFloat64);
  if (g.numel() == 0) {
    c.passed = true;
    return false;
  }
  if (!torch::isfinite(g).all().item<bool>()) {
    c.reason = what + ": result has non-finite values";
    c.max_abs_err = std::numeric_limits<double>::infinity();
    return false;
  }
  return true;
}

}  // namespace

Comparison compare(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected,
                   double atol, double rtol) {
  Comparison c;
  torch::Tensor g, e;
  if (!float64_pair(what, got, expected, c, g, e)) return c;
  auto diff = (g - e).abs();
  c.max_abs_err = diff.max().item<double>();
  auto bad = diff > (atol + rtol * e.abs());
  int64_t nbad = bad.sum().item<int64_t>();
  c.passed = nbad == 0;
  if (!c.passed) {
    std::ostringstream os;
    os << what << ": " << nbad << " of " << g.numel() << " values outside atol=" << atol
       << " rtol=" << rtol << " (max abs err " << c.max_abs_err << ")";
    c.reason = os.str();
  }
  return c;
}

Comparison compare_relative_rms(const std::string& what, const torch::Tensor& got,
                                const torch::Tensor& expected, double max_relative) {
  Comparison c;
  torch::Tensor g, e;
  if (!float64_pair(what, got, expected, c, g, e)) return c;
  c.max_abs_err = (g - e).abs().max().item<double>();
  const double err = (g - e).norm().item<double>(), ref = e.norm().item<double>();
  const double relative =
      ref > 0 ? err / ref : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  c.passed = relative <= max_relative;
  std::ostringstream os;
  os << what << ": relative RMS error " << relative << (c.passed ? " <= " : " > ") << max_relative
     << " (max abs err " << c.max_abs_err << ")";
  if (!c.passed) c.reason = os.str();
  c.note = os.str();
  return c;
}

Comparison compare_exact(const std::string& what, const torch::Tensor& got,
                         const torch::Tensor& expected) {
  Comparison c;
  if (got.sizes() != expected.sizes()) {
    c.reason =
        what + ": shape " + c10::str(got.sizes()) + ", expected " + c10::str(expected.sizes());
    c.max_abs_err = std::numeric_limits<double>::infinity();
    return c;
  }
  auto g = got.detach().to(torch::kCPU, torch::kInt64);
  auto e = expected.detach().to(torch::kCPU, torch::kInt64);
  auto ne = g.ne(e);
  int64_t nbad = ne.sum().item<int64_t>();
  c.max_abs_err = g.numel() ? (g - e).abs().max().item<double>() : 0.0;
  c.passed = nbad == 0;
  if (!c.passed) {
    auto idx = ne.flatten().nonzero().flatten()[0].item<int64_t>();
    std::ostringstream os;
    os << what << ": " << nbad << " of " << g.numel() << " values differ; first at flat index "
       << idx << ": got " << g.flatten()[idx].item<int64_t>() << ", expected "
       << e.flatten()[idx].item<int64_t>();
    c.reason = os.str();
  }
  return c;
}

void CaseResult::add(const std::string& what, const Comparison& c) {
  if (details.empty() && reason.empty()) passed = true;
  max_abs_err = std::max(max_abs_err, c.max_abs_err);
  std::ostringstream os;
  os << what << ": max_abs_err=" << c.max_abs_err << (c.passed ? " ok" : " FAIL");
  if (!c.note.empty()) os << " [" << c.note << "]";
  details.push_back(os.str());
  if (!c.passed) {
    passed = false;
    if (reason.empty()) reason = c.reason;
  }
}

std::vector<std::string> string_list(const nlohmann::json& j) {
  std::vector<std::string> out;
  if (j.is_string()) out.push_back(j.get<std::string>());
  if (j.is_array())
    for (const auto& s : j) out.push_back(s.get<std::string>());
  return out;
}

std::string golden_dir_from_env(const std::string& fallback) {
  const char* env = std::getenv("DIFFUSE_GOLDEN_DIR");
  return env && *env ? std::string(env) : fallback;
}

}  // namespace diffuse::verify
