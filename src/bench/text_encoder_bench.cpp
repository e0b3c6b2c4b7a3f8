#include "bench/text_encoder_bench.h"

#include <torch/torch.h>

#include <fstream>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "nn/layers.h"
#include "nn/random_init.h"

namespace diffuse::bench {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Parameters of the model the config describes, without building it.
double t5_params(const models::T5Config& c) {
  const double d = static_cast<double>(c.d_model),
               inner = static_cast<double>(c.num_heads * c.d_kv);
  const double ff = 3 * d * static_cast<double>(c.d_ff);  // gated: wi_0, wi_1, wo
  const double layer = 4 * d * inner + ff + 2 * d;
  return static_cast<double>(c.vocab_size) * d + c.num_layers * layer +
         static_cast<double>(c.relative_attention_num_buckets * c.num_heads) + d;
}

double llama_params(const models::LlamaConfig& c) {
  const double h = static_cast<double>(c.hidden_size), hd = static_cast<double>(c.head_dim);
  const double attn = h * hd * (c.num_attention_heads * 2 + c.num_key_value_heads * 2);
  const double mlp = 3 * h * static_cast<double>(c.intermediate_size);
  return static_cast<double>(c.vocab_size) * h + c.num_hidden_layers * (attn + mlp + 2 * h) + h;
}

}  // namespace

bool is_text_encoder_arch(const std::string& name) {
  return name == "t5-xxl" || name == "llama-3.1-8b";
}

nlohmann::json text_encoder_arch_config(const std::string& name) {
  if (name == "t5-xxl") return models::t5_xxl_encoder_config();
  if (name == "llama-3.1-8b") return models::llama31_8b_config();
  throw InvalidArgument("unknown text-encoder architecture '" + name +
                        "' (expected t5-xxl or llama-3.1-8b)");
}

TextEncoderBenchResult run_text_encoder_bench(const TextEncoderBenchOptions& o) {
  if (o.batch < 1 || o.tokens < 1 || o.repeat < 1)
    throw InvalidArgument("--batch, the token count and --steps must be >= 1");
  const io::JsonConfig cfg(text_encoder_arch_config(o.arch), o.arch + " config.json");
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "text_encoder");
  TextEncoderBenchResult r;
  r.arch = o.arch;
  r.device = device.str();
  r.dtype = c10::toString(dtype);
  r.batch = o.batch;
  r.tokens = o.tokens;
  r.threads = at::get_num_threads();
  const bool t5 = o.arch == "t5-xxl";
  const auto t5c = t5 ? models::T5Config::from_json(cfg) : models::T5Config{};
  const auto llc = t5 ? models::LlamaConfig{} : models::LlamaConfig::from_json(cfg);
  const double params = t5 ? t5_params(t5c) : llama_params(llc);
  r.params_b = params / 1e9;
  r.weights_gib = params * static_cast<double>(c10::elementSize(dtype)) / kGiB;
  r.available_gib = static_cast<double>(device::host_available_bytes()) / kGiB;
  // Weights plus ~10 % for activations and the allocator must fit in what is free now.
  if (device.is_cpu() && r.available_gib > 0 && r.weights_gib * 1.1 > r.available_gib) {
    r.skipped = true;
    r.skip_reason = "needs ~" + fmt("%.1f", r.weights_gib * 1.1) + " GiB, " +
                    fmt("%.1f", r.available_gib) + " GiB available";
    return r;
  }
  reset_peak_rss();
  double t0 = now_s();
  auto ids = torch::randint(0, 32000, {o.batch, o.tokens}, torch::kInt64).to(device);
  auto mask = torch::ones({o.batch, o.tokens}, torch::kInt64).to(device);
  std::function<void()> run;
  if (t5) {
    models::T5EncoderModel m{nullptr};
    {
      nn::SkipInitGuard skip(dtype);
      m = models::T5EncoderModel(t5c);
    }
    nn::init_pooled_random_weights(*m, o.seed);
    m->to(device, dtype);
    run = [m, ids, mask]() mutable { m->forward(ids, mask); };
  } else {
    models::LlamaForCausalLM m{nullptr};
    {
      nn::SkipInitGuard skip(dtype);
      m = models::LlamaForCausalLM(llc);
    }
    nn::init_pooled_random_weights(*m, o.seed);
    m->to(device, dtype);
    run = [m, ids, mask]() mutable { m->forward(ids, mask); };
  }
  r.build_s = now_s() - t0;
  if (o.log) o.log(o.arch + " built in " + fmt("%.1f s", r.build_s));
  r.best_s = 1e30;
  for (int i = 0; i <= o.repeat; ++i) {  // the first run warms up
    t0 = now_s();
    run();
    sync_device(device);
    const double dt = now_s() - t0;
    if (o.log) o.log(o.arch + (i == 0 ? " warm-up: " : " run: ") + fmt("%.2f s", dt));
    if (i > 0) r.best_s = std::min(r.best_s, dt);
  }
  r.peak_gib = static_cast<double>(peak_rss_bytes()) / kGiB;
  return r;
}

nlohmann::json to_json(const TextEncoderBenchResult& r) {
  return {
      {"arch", r.arch},         {"device", r.device},           {"dtype", r.dtype},
      {"batch", r.batch},       {"tokens", r.tokens},           {"threads", r.threads},
      {"params_b", r.params_b}, {"weights_gib", r.weights_gib}, {"available_gib", r.available_gib},
      {"skipped", r.skipped},   {"skip_reason", r.skip_reason}, {"build_s", r.build_s},
      {"best_s", r.best_s},     {"peak_gib", r.peak_gib}};
}

}  // namespace diffuse::bench
