#include "accel/dit_cache.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "diffuse/errors.h"
#include "io/string_split.h"

namespace diffuse::accel {
namespace {

using Method = DitCacheOptions::Method;

double parse_number(const std::string& text, const std::string& what, const std::string& field) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(v))
    throw InvalidArgument(what + ": " + field + " must be a number, got '" + text + "'");
  return v;
}

int parse_int(const std::string& text, const std::string& what, const std::string& field) {
  const double v = parse_number(text, what, field);
  if (v != std::floor(v) || std::fabs(v) > 1e6)
    throw InvalidArgument(what + ": " + field + " must be a whole number, got '" + text + "'");
  return static_cast<int>(v);
}

const char* method_name(Method m) {
  switch (m) {
    case Method::kFirstBlock:
      return "fbcache";
    case Method::kTaylorSeer:
      return "taylorseer";
    case Method::kBlockSchedule:
      return "ditcache";
    case Method::kOff:
      break;
  }
  return "off";
}

}  // namespace

DitCacheOptions parse_dit_cache(const std::string& spec, const std::string& what) {
  const auto parts = io::split_fields(spec, ':');
  const std::string& name = parts[0];
  const std::string where = what + " " + spec;
  DitCacheOptions o;
  auto at_most = [&](size_t n, const char* form) {
    if (parts.size() > n + 1)
      throw InvalidArgument(where + ": too many values (expected " + form + ")");
  };
  if (name == "off" || name == "none") {
    at_most(0, "off");
  } else if (name == "fbcache") {
    at_most(1, "fbcache[:THRESHOLD]");
    o.method = Method::kFirstBlock;
    if (parts.size() > 1) o.threshold = parse_number(parts[1], where, "THRESHOLD");
  } else if (name == "taylorseer") {
    at_most(2, "taylorseer[:INTERVAL[:ORDER]]");
    o.method = Method::kTaylorSeer;
    if (parts.size() > 1) o.interval = parse_int(parts[1], where, "INTERVAL");
    if (parts.size() > 2) o.order = parse_int(parts[2], where, "ORDER");
  } else if (name == "ditcache") {
    at_most(3, "ditcache[:FIRST:LAST[:INTERVAL]]");
    o.method = Method::kBlockSchedule;
    o.interval = 2;
    if (parts.size() == 2)
      throw InvalidArgument(where + ": give both FIRST and LAST blocks (ditcache:FIRST:LAST)");
    if (parts.size() > 2) {
      o.first_block = parse_int(parts[1], where, "FIRST");
      o.last_block = parse_int(parts[2], where, "LAST");
    }
    if (parts.size() > 3) o.interval = parse_int(parts[3], where, "INTERVAL");
  } else {
    throw InvalidArgument(where +
                          ": expected off, fbcache[:THRESHOLD], taylorseer[:INTERVAL[:ORDER]] "
                          "or ditcache[:FIRST:LAST[:INTERVAL]]");
  }
  try {
    validate_dit_cache(o);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + ": " + e.what());
  }
  return o;
}

std::string dit_cache_spec(const DitCacheOptions& o) {
  std::ostringstream s;
  s << method_name(o.method);
  switch (o.method) {
    case Method::kFirstBlock:
      s << ':' << o.threshold;
      break;
    case Method::kTaylorSeer:
      s << ':' << o.interval << ':' << o.order;
      break;
    case Method::kBlockSchedule:
      s << ':' << o.first_block << ':' << o.last_block << ':' << o.interval;
      break;
    case Method::kOff:
      break;
  }
  return s.str();
}

void validate_dit_cache(const DitCacheOptions& o) {
  if (!(o.threshold >= 0 && o.threshold <= 1))
    throw InvalidArgument(
        "the first-block cache threshold must be in [0, 1] (a relative change), got " +
        std::to_string(o.threshold));
  if (o.interval < 1 || o.interval > 100)
    throw InvalidArgument("the cache interval must be in [1, 100] steps, got " +
                          std::to_string(o.interval));
  if (o.order < 0 || o.order > 2)
    throw InvalidArgument("the TaylorSeer order must be 0, 1 or 2, got " + std::to_string(o.order));
  if (o.warmup < 0 || o.warmup > 1000)
    throw InvalidArgument("the cache warm-up must be in [0, 1000] steps, got " +
                          std::to_string(o.warmup));
  const bool automatic = o.first_block == -1 && o.last_block == -1;
  if (!automatic && (o.first_block < 0 || o.last_block < o.first_block))
    throw InvalidArgument(
        "the cached blocks must be FIRST <= LAST, both >= 0 (or both -1: the "
        "middle half of the single-stream blocks), got " +
        std::to_string(o.first_block) + ".." + std::to_string(o.last_block));
}

void refuse_dit_cache_on_unet(const DitCacheOptions& o, const std::string& what) {
  if (o.method == Method::kOff) return;
  throw InvalidArgument(what + " " + dit_cache_spec(o) +
                        ": the DiT caches serve transformer (DiT) models such as HiDream; this is "
                        "a UNet model (Stable Diffusion), whose caches are DeepCache "
                        "(--deepcache) and token merging (--tome)");
}

DitCache::DitCache(const DitCacheOptions& options, int64_t dual_blocks, int64_t single_blocks)
    : options_(options), blocks_(dual_blocks + single_blocks) {
  validate_dit_cache(options_);
  if (options_.method != Method::kBlockSchedule) return;
  if (options_.first_block < 0) {
    const int64_t base = single_blocks > 0 ? dual_blocks : 0;
    const int64_t n = single_blocks > 0 ? single_blocks : dual_blocks;
    first_ = base + n / 4;
    last_ = base + std::max(n / 4, 3 * n / 4 - 1);
  } else {
    first_ = options_.first_block;
    last_ = options_.last_block;
  }
  const bool in_dual = last_ < dual_blocks;
  const bool in_single = first_ >= dual_blocks && last_ < blocks_;
  if (!in_dual && !in_single)
    throw InvalidArgument("--cache ditcache: blocks " + std::to_string(first_) + ".." +
                          std::to_string(last_) + " are not within the dual-stream blocks 0.." +
                          std::to_string(dual_blocks - 1) + " or the single-stream blocks " +
                          std::to_string(dual_blocks) + ".." + std::to_string(blocks_ - 1) +
                          " of this model");
  options_.first_block = static_cast<int>(first_);
  options_.last_block = static_cast<int>(last_);
}

void DitCache::begin_step(int step, int total) {
  step_ = step;
  total_ = total;
}

void DitCache::begin_call(const torch::Tensor& image_tokens) {
  const auto sizes = image_tokens.sizes().vec();
  if (sizes != shape_) {
    reset();
    shape_ = sizes;
  }
  feature_dtype_ = image_tokens.scalar_type();
  call_cached_ = false;
  ++calls_;
  blocks_possible_ += blocks_;
}

void DitCache::reset() {
  first_residual_ = remaining_ = torch::Tensor();
  taylor_.clear();
  taylor_step_ = -1;
  range_inputs_.clear();
  range_residuals_.clear();
}

void DitCache::mark_cached() {
  if (!call_cached_) ++cached_calls_;
  call_cached_ = true;
}

bool DitCache::full_step() const {
  return step_ < options_.warmup || (step_ - options_.warmup) % options_.interval == 0;
}

bool DitCache::forecasts() const {
  return options_.method == Method::kTaylorSeer && !full_step() && taylor_step_ >= 0 &&
         step_ > taylor_step_;
}

torch::Tensor DitCache::forecast() {
  mark_cached();
  const double k = step_ - taylor_step_;
  torch::Tensor f = taylor_[0];
  if (options_.order >= 1 && taylor_.size() > 1) f = f + taylor_[1] * k;
  if (options_.order >= 2 && taylor_.size() > 2) f = f + taylor_[2] * (k * k / 2);
  return f.to(feature_dtype_);
}

bool DitCache::reuses_range_at(int64_t index) const {
  return options_.method == Method::kBlockSchedule && index == first_ && !full_step() &&
         !range_residuals_.empty();
}

std::vector<torch::Tensor> DitCache::apply_range(const std::vector<torch::Tensor>& inputs) {
  mark_cached();
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) out.push_back(inputs[i] + range_residuals_.at(i));
  return out;
}

void DitCache::before_block(int64_t index, const std::vector<torch::Tensor>& inputs) {
  ++blocks_run_;
  if (options_.method == Method::kBlockSchedule && index == first_) range_inputs_ = inputs;
}

void DitCache::after_block(int64_t index, const std::vector<torch::Tensor>& outputs) {
  if (options_.method != Method::kBlockSchedule || index != last_ ||
      range_inputs_.size() != outputs.size())
    return;
  range_residuals_.clear();
  for (size_t i = 0; i < outputs.size(); ++i)
    range_residuals_.push_back(outputs[i] - range_inputs_[i]);
  range_inputs_.clear();
}

bool DitCache::reuse_after_first_block(const torch::Tensor& first_residual) {
  if (options_.method != Method::kFirstBlock) return false;
  if (step_ >= options_.warmup && first_residual_.defined() && remaining_.defined()) {
    // Mean absolute values compared as sums (the count cancels), added over the ranks where
    // the tokens are split.
    std::vector<double> sums = {
        first_residual_.abs().sum(torch::kFloat64).item<double>(),
        (first_residual - first_residual_).abs().sum(torch::kFloat64).item<double>()};
    if (rank_sum_) sums = rank_sum_(sums);
    if (branch_sum_) sums = branch_sum_(sums);
    const double before = sums[0], change = sums[1];
    // Against the last full step's residual, not the last call's: small changes add up.
    if (change < options_.threshold * before) {
      mark_cached();
      return true;
    }
  }
  first_residual_ = first_residual;
  return false;
}

void DitCache::record_final(const torch::Tensor& features, const torch::Tensor& after_first_block) {
  if (options_.method == Method::kFirstBlock && after_first_block.defined())
    remaining_ = features - after_first_block;
  if (options_.method != Method::kTaylorSeer) return;
  const auto f = features.to(torch::kFloat32);
  std::vector<torch::Tensor> terms = {f};
  if (taylor_step_ >= 0 && step_ > taylor_step_) {
    // Finite differences per step between this full step and the last.
    const double d = step_ - taylor_step_;
    for (size_t i = 0; i < taylor_.size() && static_cast<int>(i) < options_.order; ++i)
      terms.push_back((terms[i] - taylor_[i]) / d);
  }
  taylor_ = std::move(terms);
  taylor_step_ = step_;
}

std::string dit_cache_summary(const DitCacheOptions& options, const DitCacheStats& stats) {
  return "cache " + dit_cache_spec(options) + ": " + std::to_string(stats.cached_calls) + " of " +
         std::to_string(stats.full_calls + stats.cached_calls) + " steps skipped blocks, " +
         std::to_string(stats.blocks_run) + " of " + std::to_string(stats.blocks_possible) +
         " blocks ran";
}

}  // namespace diffuse::accel
