#include "verify/golden.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "io/safetensors.h"

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
  for (const auto& c : set.index["cases"]) {
    GoldenCase gc;
    if (!c.contains("name") || !c.contains("component") || !c.contains("file"))
      throw FormatError(path + ": every case needs 'name', 'component' and 'file'");
    gc.name = c["name"].get<std::string>();
    gc.component = c["component"].get<std::string>();
    gc.file = (fs::path(dir) / c["file"].get<std::string>()).string();
    gc.params = c.value("params", nlohmann::json::object());
    gc.tolerance = c.value("tolerance", nlohmann::json::object());
    gc.raw = c;
    set.cases.push_back(std::move(gc));
  }
  return set;
}

std::string GoldenSet::model_dir() const {
  return (fs::path(dir) / index.value("model_dir", std::string("model"))).string();
}

std::string GoldenSet::single_file_checkpoint() const {
  if (!index.contains("single_file_checkpoint") || !index["single_file_checkpoint"].is_string()) return "";
  return (fs::path(dir) / index["single_file_checkpoint"].get<std::string>()).string();
}

const GoldenCase* GoldenSet::find(const std::string& name) const {
  for (const auto& c : cases)
    if (c.name == name) return &c;
  return nullptr;
}

CaseTensors::CaseTensors(const std::string& path) : file_(io::SafetensorsFile::open(path)) {}

bool CaseTensors::has(const std::string& name) const { return file_->contains(name); }

torch::Tensor CaseTensors::get(const std::string& name) const {
  if (!file_->contains(name)) throw FormatError(file_->path() + ": case has no tensor '" + name + "'");
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
    c.reason = what + ": shape " + c10::str(got.sizes()) + ", expected " + c10::str(expected.sizes());
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

Comparison compare_exact(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected) {
  Comparison c;
  if (got.sizes() != expected.sizes()) {
    c.reason = what + ": shape " + c10::str(got.sizes()) + ", expected " + c10::str(expected.sizes());
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
