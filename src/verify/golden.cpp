#include "verify/golden.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "diffuse/errors.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace fs = std::filesystem;

namespace diffuse::verify {

double GoldenCase::tol(const std::string& key, double fallback) const {
  if (tolerance.is_object() && tolerance.contains(key) && tolerance[key].is_number())
    return tolerance[key].get<double>();
  return fallback;
}

GoldenSet GoldenSet::load(const std::string& dir) {
  std::string path = (fs::path(dir) / "cases.json").string();
  if (!fs::exists(path)) throw IoError("golden set '" + dir + "' has no cases.json");
  auto cfg = io::JsonConfig::load(path);
  GoldenSet set;
  set.dir = dir;
  set.index = cfg.json();
  if (!set.index.contains("cases") || !set.index["cases"].is_array())
    throw FormatError(path + ": missing array 'cases'");
  if (set.index["cases"].empty())
    throw FormatError(path + ": 'cases' is empty: a golden set without cases verifies nothing");
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
    gc.component = c["component"].get<std::string>();
    io::require_inside_folder(c["file"].get<std::string>(), path, "case '" + gc.name + "' file");
    gc.file = (fs::path(dir) / c["file"].get<std::string>()).string();
    for (const char* key : {"params", "tolerance"})
      if (c.contains(key) && !c[key].is_object())
        throw FormatError(path + ": case '" + gc.name + "': '" + key + "' must be an object, got " +
                          c[key].dump().substr(0, 80));
    gc.params = c.value("params", nlohmann::json::object());
    gc.tolerance = c.value("tolerance", nlohmann::json::object());
    gc.raw = c;
    set.cases.push_back(std::move(gc));
  }
  return set;
}

void GoldenSet::check_files() const {
  const std::string source = (fs::path(dir) / "cases.json").string();
  if (!index.contains("files")) return;
  if (!index["files"].is_object())
    throw FormatError(source + ": 'files' must be an object path -> {bytes, sha256}");
  for (const auto& [name, entry] : index["files"].items()) {
    io::require_inside_folder(name, source, "files entry");
    if (!entry.is_object() || !entry.contains("sha256") || !entry["sha256"].is_string())
      throw FormatError(source + ": files['" + name + "'] needs a 'sha256' string");
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path))
      throw FormatError("golden file missing: " + path + " (listed in " + source + ")");
    if (entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
        entry["bytes"].get<uint64_t>() != fs::file_size(path))
      throw FormatError("golden file corrupted: " + path + ": " +
                        std::to_string(fs::file_size(path)) + " bytes, cases.json says " +
                        std::to_string(entry["bytes"].get<uint64_t>()));
    const std::string got = io::sha256_file_hex(path);
    if (got != entry["sha256"].get<std::string>())
      throw FormatError("golden file corrupted: " + path + ": sha256 " + got +
                        ", cases.json says " + entry["sha256"].get<std::string>());
  }
}

std::string GoldenSet::model_dir() const {
  return (fs::path(dir) / index.value("model_dir", std::string("model"))).string();
}

std::string GoldenSet::single_file_checkpoint() const {
  if (!index.contains("single_file_checkpoint") || !index["single_file_checkpoint"].is_string())
    return "";
  return (fs::path(dir) / index["single_file_checkpoint"].get<std::string>()).string();
}

const GoldenCase* GoldenSet::find(const std::string& name) const {
  for (const auto& c : cases)
    if (c.name == name) return &c;
  return nullptr;
}

CaseTensors::CaseTensors(const std::string& path) : file_(io::SafetensorsFile::open(path)) {}

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

Comparison compare(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected,
                   double atol, double rtol) {
  Comparison c;
  if (got.sizes() != expected.sizes()) {
    c.reason =
        what + ": shape " + c10::str(got.sizes()) + ", expected " + c10::str(expected.sizes());
    c.max_abs_err = std::numeric_limits<double>::infinity();
    return c;
  }
  auto g = got.detach().to(torch::kCPU, torch::kFloat64);
  auto e = expected.detach().to(torch::kCPU, torch::kFloat64);
  if (g.numel() == 0) {
    c.passed = true;
    return c;
  }
  if (!torch::isfinite(g).all().item<bool>()) {
    c.reason = what + ": result has non-finite values";
    c.max_abs_err = std::numeric_limits<double>::infinity();
    return c;
  }
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
