#include "bench/lora_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "adapters/lora.h"
#include "adapters/lora_merger.h"
#include "adapters/lora_runtime.h"
#include "bench/bench_util.h"
#include "bench/unet_inputs.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "io/lora_key_map.h"
#include "models/builtin_configs.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "nn/random_init.h"

namespace diffuse::bench {
namespace {

template <typename F>
double timed(F f) {
  const double t0 = now_s();
  f();
  return now_s() - t0;
}

bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

// peft pairs over every attention projection of `module` (UNet: to_q/k/v/out.0; CLIP:
// q/k/v/out_proj), named with `prefix`.
void add_pairs(const torch::nn::Module& module, const std::string& prefix, int rank,
               std::map<std::string, torch::Tensor>* out, int* pairs, double* params) {
  for (const auto& p : module.named_parameters()) {
    const std::string& k = p.key();
    bool attention = false;
    for (const char* s : {".to_q.weight", ".to_k.weight", ".to_v.weight", ".to_out.0.weight",
                          ".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".out_proj.weight"})
      attention = attention || ends_with(k, s);
    if (!attention || p.value().dim() != 2) continue;
    const std::string m = prefix + k.substr(0, k.size() - 7);
    const int64_t o = p.value().size(0), i = p.value().size(1);
    (*out)[m + ".lora_A.weight"] = torch::randn({rank, i}) / std::sqrt(static_cast<double>(i));
    (*out)[m + ".lora_B.weight"] = torch::randn({o, rank}) * 0.01;
    *pairs += 1;
    *params += static_cast<double>(rank * (i + o)) / 1e6;
  }
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(torch::nn::Module& m, const std::vector<torch::Tensor>& before) {
  size_t i = 0;
  for (const auto& p : m.parameters())
    if (!torch::equal(p, before.at(i++))) return false;
  return true;
}

}  // namespace

LoraBenchResult run_lora_bench(const LoraBenchOptions& o) {
  if (o.rank < 1 || o.rank > 1024)
    throw InvalidArgument("bench lora: --rank must be in [1, 1024], got " + std::to_string(o.rank));
  if (o.repeats < 1 || o.repeats > 100)
    throw InvalidArgument("bench lora: --repeats must be in [1, 100]");
  if (o.batch < 1 || o.batch > 16) throw InvalidArgument("bench lora: --batch must be in [1, 16]");
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  torch::InferenceMode guard;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();  // the pipelines' heap policy, so steps cost what they cost
                                    // there
  const auto& arch = models::builtin_arch(o.arch);
  const torch::Device cpu(torch::kCPU);
  const auto dtype = device::resolve_dtype(o.dtype, cpu, "unet");
  LoraBenchResult r;
  r.arch = arch.name;
  r.dtype = device::dtype_name(dtype);
  r.rank = o.rank;

  const auto unet_cfg =
      models::UNet2DConditionConfig::from_json(io::JsonConfig(arch.unet, arch.name + " unet"));
  const auto text_cfg = models::ClipTextConfig::from_json(
      io::JsonConfig(arch.text_encoder, arch.name + " text_encoder"));
  const int64_t f = 8;
  if (o.width % (f * unet_cfg.spatial_factor()) || o.height % (f * unet_cfg.spatial_factor()) ||
      o.width < 64 || o.height < 64 || o.width > 2048 || o.height > 2048)
    throw InvalidArgument("bench lora: -W/-H must be multiples of 64 in [64, 2048]");
  models::UNet2DConditionModel unet{nullptr};
  models::ClipTextModel text{nullptr};
  {
    nn::SkipInitGuard skip(dtype);
    unet = models::UNet2DConditionModel(unet_cfg);
    text = models::ClipTextModel(text_cfg);
  }
  nn::init_pooled_random_weights(*unet, o.seed + 1);
  nn::init_pooled_random_weights(*text, o.seed + 2);
  unet->to(dtype);
  text->to(dtype);
  unet->eval();
  text->eval();
  log("built " + arch.name + " UNet + text encoder (" + r.dtype + ")");

  torch::manual_seed(static_cast<int64_t>(o.seed) + 3);
  std::map<std::string, torch::Tensor> tensors;
  add_pairs(*unet, "unet.", o.rank, &tensors, &r.pairs, &r.adapter_params_m);
  add_pairs(*text, "text_encoder.", o.rank, &tensors, &r.pairs, &r.adapter_params_m);
  const std::vector<adapters::Network> nets = {{io::lora::text_encoder_names(), text.get()},
                                               {io::lora::unet_names(), unet.get()}};
  adapters::LoraAdapter adapter;
  r.read_s = timed([&] { adapter = adapters::make_lora(tensors, {}, "random", nets); });
  log("adapter: " + std::to_string(r.pairs) + " pairs of rank " + std::to_string(o.rank) +
      ", checked in " + fmt("%.2f s", r.read_s));

  // Merged: apply, rescale, remove (three times each; medians), then the restore checked.
  const auto before_unet = snapshot(*unet);
  const auto before_text = snapshot(*text);
  {
    std::vector<double> apply, rescale, remove;
    adapters::LoraMerger merger(nets);
    for (int i = 0; i < 3; ++i) {
      int id = 0;
      apply.push_back(timed([&] { id = merger.add(adapter, 1.0); }));
      rescale.push_back(timed([&] { merger.set_scale(id, 0.5); }));
      remove.push_back(timed([&] { merger.remove(id); }));
    }
    r.apply_s = median(apply);
    r.rescale_s = median(rescale);
    r.remove_s = median(remove);
  }
  r.restored_bit_identical = same(*unet, before_unet) && same(*text, before_text);
  {
    std::vector<double> attach, detach;
    adapters::LoraRuntime runtime(nets);
    for (int i = 0; i < 3; ++i) {
      int id = 0;
      attach.push_back(timed([&] { id = runtime.add(adapter, 1.0); }));
      detach.push_back(timed([&] { runtime.remove(id); }));
    }
    r.attach_s = median(attach);
    r.detach_s = median(detach);
  }
  log("merged: apply " + fmt("%.2f s", r.apply_s) + ", rescale " + fmt("%.2f s", r.rescale_s) +
      ", remove " + fmt("%.2f s", r.remove_s) + "; unmerged: attach " + fmt("%.3f s", r.attach_s) +
      ", detach " + fmt("%.3f s", r.detach_s));

  // The UNet step in the three settings, interleaved so that drift hits all alike.
  const auto opts = torch::TensorOptions().dtype(dtype);
  auto sample = torch::randn({o.batch, unet_cfg.in_channels, o.height / f, o.width / f}, opts);
  auto ctx = torch::randn({o.batch, 77, unet_cfg.cross_attention_dim[0]}, opts);
  auto t = torch::tensor(500.0);
  auto gen = at::detail::createCPUGenerator(3);
  const auto added = random_added_conditions(unet_cfg, o.batch, o.height, o.width, gen,
                                             torch::Device(torch::kCPU), dtype);
  auto step = [&] {
    return timed([&] { unet->forward(sample, t, ctx, nullptr, added_or_null(added)); });
  };
  std::vector<double> plain, merged, unmerged;
  adapters::LoraMerger merger({nets[1]});
  adapters::LoraRuntime runtime({nets[1]});
  const auto unet_part = adapters::select_network(adapter, 1);
  for (int i = 0; i <= o.repeats; ++i) {
    const double p = step();
    const int mid = merger.add(unet_part, 1.0);
    const double m = step();
    merger.remove(mid);
    const int rid = runtime.add(unet_part, 1.0);
    const double u = step();
    runtime.remove(rid);
    if (i == 0) continue;  // warm-up
    plain.push_back(p);
    merged.push_back(m);
    unmerged.push_back(u);
    log("step " + std::to_string(i) + ": plain " + fmt("%.2f s", p) + ", merged " +
        fmt("%.2f s", m) + ", unmerged " + fmt("%.2f s", u));
  }
  r.step_plain_s = median(plain);
  r.step_merged_s = median(merged);
  r.step_unmerged_s = median(unmerged);
  return r;
}

}  // namespace diffuse::bench
