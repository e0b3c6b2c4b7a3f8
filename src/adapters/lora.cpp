// Reading and checking LoRA adapters (see adapters/lora.h).
#include "adapters/lora.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "diffuse/errors.h"
#include "io/safetensors.h"
#include "io/weight_layout.h"

namespace diffuse::adapters {
namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

struct Target {
  size_t network = 0;
  std::string param;
  std::vector<int64_t> shape;
  // A pair named after the network's other layout (Network::file_layout) on a fused weight:
  // the rows of its up matrix that belong to this parameter. Empty key: the whole pair.
  io::WeightSlice rows;
};

// The network's other naming (Network::file_layout) as LoRA files write it: the file's module
// ("double_blocks.0.img_attn.qkv") and its kohya flattening ("double_blocks_0_img_attn_qkv"),
// each with the parameters it feeds and their rows.
class LayoutIndex {
 public:
  explicit LayoutIndex(const Network& n) : names_(n.names) {
    for (const auto& [param, slice] : n.file_layout) {
      const std::string suffix = ".weight";
      if (slice.key.size() <= suffix.size() ||
          slice.key.compare(slice.key.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;  // biases and norms take no LoRA
      const std::string module = slice.key.substr(0, slice.key.size() - suffix.size());
      std::string flat = module;
      std::replace(flat.begin(), flat.end(), '.', '_');
      by_module_[module].push_back({param, slice});
      by_flat_[flat].push_back({param, slice});
    }
    for (const auto& [alias, module] : n.module_aliases) {
      const auto it = by_module_.find(module);
      if (it != by_module_.end()) by_module_[alias] = it->second;
    }
  }
  // The parameters a pair named in the file layout patches, with their rows; empty if none.
  std::vector<std::pair<std::string, io::WeightSlice>> targets(const io::lora::PairKeys& pk) const {
    const auto& table = pk.kohya ? by_flat_ : by_module_;
    std::vector<std::string> prefixes = pk.kohya ? names_.kohya_prefixes : names_.peft_prefixes;
    if (!pk.kohya)  // ComfyUI / ai-toolkit write the checkpoint's own prefix
      prefixes.insert(prefixes.end(), {"diffusion_model.", "model.diffusion_model.", ""});
    for (const auto& p : prefixes) {
      if (pk.prefix.compare(0, p.size(), p) != 0) continue;
      const auto it = table.find(pk.prefix.substr(p.size()));
      if (it != table.end()) return it->second;
    }
    return {};
  }

 private:
  io::lora::NetworkNames names_;
  std::map<std::string, std::vector<std::pair<std::string, io::WeightSlice>>> by_module_, by_flat_;
};

// Parameter names and shapes of every network, with the name index of each.
class Targets {
 public:
  explicit Targets(const std::vector<Network>& networks) {
    for (const auto& n : networks) {
      if (!n.module) throw InvalidArgument("LoRA: network '" + n.names.name + "' is null");
      std::vector<std::string> names;
      std::map<std::string, std::vector<int64_t>> shapes;
      for (const auto& p : n.module->named_parameters(/*recurse=*/true)) {
        names.push_back(p.key());
        shapes[p.key()] = p.value().sizes().vec();
      }
      index_.emplace_back(n.names, names);
      layouts_.emplace_back(n);
      shapes_.push_back(std::move(shapes));
    }
  }
  const LayoutIndex& layout(size_t i) const { return layouts_[i]; }
  size_t size() const { return index_.size(); }
  const io::lora::ModuleIndex& index(size_t i) const { return index_[i]; }
  const std::vector<int64_t>& shape(size_t i, const std::string& p) const {
    return shapes_[i].at(p);
  }

 private:
  std::vector<io::lora::ModuleIndex> index_;
  std::vector<LayoutIndex> layouts_;
  std::vector<std::map<std::string, std::vector<int64_t>>> shapes_;
};

class Checker {
 public:
  explicit Checker(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(source_ + ": " + what);
  }
  void finite(const std::string& key, const torch::Tensor& t) const {
    if (t.numel() && !torch::isfinite(t).all().item<bool>())
      fail("tensor '" + key + "' holds NaN or infinite values");
  }
  // Integer or boolean tensors would be cast and added to the weights as numbers.
  void floating(const std::string& key, const torch::Tensor& t) const {
    if (!t.is_floating_point())
      fail("tensor '" + key + "' holds " + std::string(c10::toString(t.scalar_type())) +
           " values; LoRA weights are floating point (F16, BF16, F32 or F64)");
  }
  // Two entries of the file (e.g. one named kohya-style, one peft-style) for one weight would
  // patch it twice.
  void once(const std::string& key, const std::string& weight) {
    const auto [it, fresh] = patched_.emplace(weight, key);
    if (!fresh)
      fail("'" + it->second + "' and '" + key + "' both patch " + weight +
           ": the file names one layer twice");
  }

 private:
  std::string source_;
  std::map<std::string, std::string> patched_;  // weight -> the entry that patches it
};

std::optional<double> metadata_number(const std::map<std::string, std::string>& metadata,
                                      const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return std::nullopt;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used == it->second.size() && std::isfinite(v) && v > 0) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// Checks that up [out, r(, 1, 1)] @ down [r, in(, kh, kw)] has the shape of the target weight
// (a 1x1 conv and a linear layer are interchangeable).
bool fits(const torch::Tensor& up, const torch::Tensor& down, const std::vector<int64_t>& target) {
  if (target.size() != 2 && target.size() != 4) return false;
  if (target[0] != up.size(0) || target[1] != down.size(1)) return false;
  const int64_t kh = down.dim() == 4 ? down.size(2) : 1, kw = down.dim() == 4 ? down.size(3) : 1;
  const int64_t th = target.size() == 4 ? target[2] : 1, tw = target.size() == 4 ? target[3] : 1;
  return kh == th && kw == tw;
}

}  // namespace

LoraAdapter make_lora(const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata, const std::string& source,
                      const std::vector<Network>& networks, const LoraOptions& options) {
  Checker check(source);
  std::vector<std::string> keys;
  for (const auto& kv : tensors) keys.push_back(kv.first);
  const io::lora::FileKeys file = io::lora::group_keys(keys, source);
  const Targets targets(networks);

  const std::optional<double> meta_alpha = metadata_number(metadata, "lora_alpha");
  const std::optional<double> meta_rank = metadata_number(metadata, "lora_rank");

  LoraAdapter out;
  out.source = source;
  std::vector<std::string> unmatched;
  for (const auto& pk : file.pairs) {
    std::vector<Target> pair_targets;
    bool ambiguous = false;
    for (size_t i = 0; i < targets.size() && pair_targets.empty(); ++i) {
      bool amb = false;
      std::string p = targets.index(i).pair_target(pk, &amb);
      ambiguous |= amb;
      if (!p.empty()) pair_targets.push_back(Target{i, p, targets.shape(i, p), {}});
    }
    // Named after the network's other layout: a fused weight's pair patches each part.
    for (size_t i = 0; i < targets.size() && pair_targets.empty(); ++i)
      for (const auto& [param, rows] : targets.layout(i).targets(pk))
        pair_targets.push_back(Target{i, param, targets.shape(i, param), rows});
    if (pair_targets.empty()) {
      unmatched.push_back(pk.prefix + (ambiguous ? " (ambiguous kohya name)" : ""));
      continue;
    }
    const torch::Tensor& down = tensors.at(pk.down);
    const torch::Tensor& whole_up = tensors.at(pk.up);
    for (const auto& target_part : pair_targets) {
      const Target* target = &target_part;
      const torch::Tensor up =
          target->rows.key.empty()
              ? whole_up
              : io::take_slice(whole_up, target->rows, source + ": LoRA '" + pk.up + "'");
      if (down.dim() != 2 && down.dim() != 4)
        check.fail("'" + pk.down + "' has shape " + shape_str(down.sizes()) +
                   ", expected [rank, in] or [rank, in, kh, kw]");
      if (!(up.dim() == 2 || (up.dim() == 4 && up.size(2) == 1 && up.size(3) == 1)))
        check.fail("'" + pk.up + "' has shape " + shape_str(up.sizes()) +
                   ", expected [out, rank] or [out, rank, 1, 1]");
      check.floating(pk.down, down);
      check.floating(pk.up, up);
      if (down.size(0) == 0)
        check.fail("'" + pk.down + "' has rank 0 (shape " + shape_str(down.sizes()) + ")");
      if (up.size(1) != down.size(0))
        check.fail("rank mismatch: '" + pk.down + "' has rank " + std::to_string(down.size(0)) +
                   " (shape " + shape_str(down.sizes()) + ") but '" + pk.up + "' has rank " +
                   std::to_string(up.size(1)) + " (shape " + shape_str(up.sizes()) + ")");
      if (!fits(up, down, target->shape)) {
        std::vector<int64_t> delta{up.size(0), down.size(1)};
        if (down.dim() == 4) delta.insert(delta.end(), {down.size(2), down.size(3)});
        check.fail("'" + pk.prefix + "' gives an update of shape " + shape_str(delta) + " (up " +
                   shape_str(up.sizes()) + ", down " + shape_str(down.sizes()) +
                   ") that fits no target: its module " + networks[target->network].names.name +
                   "." + target->param + " has shape " + shape_str(target->shape));
      }
      check.finite(pk.down, down);
      check.finite(pk.up, up);
      check.once(pk.prefix, networks[target->network].names.name + "." + target->param);

      const double rank = static_cast<double>(down.size(0));
      double alpha = rank;
      std::string alpha_from = "the rank (no alpha given)";
      if (!pk.alpha.empty()) {
        const torch::Tensor& a = tensors.at(pk.alpha);
        if (a.numel() != 1) check.fail("alpha '" + pk.alpha + "' is not a scalar");
        check.finite(pk.alpha, a);
        alpha = a.to(torch::kFloat64).item<double>();
        alpha_from = "tensor '" + pk.alpha + "'";
      } else if (options.alpha) {
        alpha = *options.alpha * rank / options.rank.value_or(rank);
        alpha_from = "--lora-alpha";
      } else if (meta_alpha) {
        alpha = *meta_alpha * rank / meta_rank.value_or(rank);
        alpha_from = "the file's lora_alpha metadata";
      }
      // alpha / rank scales the update (trained adapters: about 0.5-16). Far outside that the
      // patched weights overflow into Inf/NaN and the run would end in a NaN stage error that
      // names neither the adapter nor its alpha.
      constexpr double kMaxFactor = 1000.0;
      if (!(std::abs(alpha / rank) <= kMaxFactor)) {
        std::ostringstream msg;
        msg << "'" << pk.prefix << "': alpha " << alpha << " (from " << alpha_from << ") over rank "
            << rank << " scales the update by " << alpha / rank << ", outside [-" << kMaxFactor
            << ", " << kMaxFactor << "]";
        check.fail(msg.str());
      }
      LoraPair pair;
      pair.key = pk.prefix;
      pair.network = target->network;
      pair.param = target->param;
      pair.up = up.to(torch::kFloat32).reshape({up.size(0), up.size(1)}).contiguous();
      pair.down = down.to(torch::kFloat32).reshape({down.size(0), -1}).contiguous();
      pair.factor = alpha / rank;
      out.pairs.push_back(std::move(pair));
      out.touched[networks[target->network].names.name]++;
    }
  }
  for (const auto& key : file.full) {
    std::optional<Target> target;
    for (size_t i = 0; i < targets.size() && !target; ++i) {
      std::string p = targets.index(i).full_target(key);
      if (!p.empty()) target = Target{i, p, targets.shape(i, p), {}};
    }
    if (!target) {
      unmatched.push_back(key);
      continue;
    }
    const torch::Tensor& value = tensors.at(key);
    if (value.sizes().vec() != target->shape)
      check.fail("full tensor '" + key + "' has shape " + shape_str(value.sizes()) +
                 " but the weight it replaces, " + networks[target->network].names.name + "." +
                 target->param + ", has shape " + shape_str(target->shape));
    check.floating(key, value);
    check.finite(key, value);
    check.once(key, networks[target->network].names.name + "." + target->param);
    out.full.push_back({key, target->network, target->param, value.contiguous()});
    out.touched[networks[target->network].names.name]++;
  }
  if (!unmatched.empty()) {
    std::string networks_list;
    for (const auto& n : networks)
      networks_list += (networks_list.empty() ? "" : ", ") + n.names.name;
    std::string list;
    for (size_t i = 0; i < unmatched.size() && i < 5; ++i)
      list += (i ? ", '" : "'") + unmatched[i] + "'";
    if (unmatched.size() > 5) list += ", ...";
    const std::string msg = std::to_string(unmatched.size()) +
                            " entries (LoRA pairs or full tensors) match no weight of " +
                            networks_list + ": " + list;
    if (!options.lenient)
      check.fail(msg + " (lenient mode, --lora-lenient, skips them with a warning)");
    out.warnings.push_back(source + ": skipped " + msg);
  }
  if (out.pairs.empty() && out.full.empty())
    out.warnings.push_back(source + ": the adapter changes no weight");
  return out;
}

LoraAdapter load_lora(const std::string& path, const std::vector<Network>& networks,
                      const LoraOptions& options) {
  auto file = io::SafetensorsFile::open(path);
  return make_lora(file->load_all(), file->metadata(), path, networks, options);
}

LoraAdapter select_network(const LoraAdapter& adapter, size_t network) {
  LoraAdapter out;
  out.source = adapter.source;
  out.warnings = adapter.warnings;
  for (const auto& p : adapter.pairs)
    if (p.network == network) {
      out.pairs.push_back(p);
      out.pairs.back().network = 0;
    }
  for (const auto& f : adapter.full)
    if (f.network == network) {
      out.full.push_back(f);
      out.full.back().network = 0;
    }
  return out;
}

torch::Tensor lora_delta(const LoraPair& pair, c10::IntArrayRef shape) {
  return torch::matmul(pair.up, pair.down).reshape(shape);
}

std::string describe(const LoraAdapter& adapter, const std::string& path, double scale) {
  std::string line = path + " (scale " + c10::str(scale) +
                     "): " + std::to_string(adapter.pairs.size() + adapter.full.size()) +
                     " weights";
  for (const auto& [net, count] : adapter.touched) line += ", " + net + " " + std::to_string(count);
  for (const auto& warning : adapter.warnings) line += "; warning: " + warning;
  return line;
}

}  // namespace diffuse::adapters
