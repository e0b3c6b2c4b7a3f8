#include "bench/hidream_stream_bench.h"

#include <torch/torch.h>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "models/load_component.h"

namespace diffuse::bench {
namespace {

double gib(double bytes) {
  return bytes / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

HiDreamStreamBenchResult run_hidream_stream_bench(const HiDreamStreamBenchOptions& o) {
  if (o.stream != "auto" && o.stream != "on" && o.stream != "off")
    throw InvalidArgument("--stream-weights: expected auto, on or off, got '" + o.stream + "'");
  if (o.batch < 1 || o.batch > 8) throw InvalidArgument("--batch must be in [1, 8]");
  if (o.text_tokens < 1 || o.text_tokens > 512)
    throw InvalidArgument("--text-tokens must be in [1, 512]");
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  torch::InferenceMode guard;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();  // as the HiDream pipeline runs
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "transformer");
  HiDreamStreamBenchResult r;
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  const auto folder = io::ModelFolder::open(o.model);
  const auto bytes = models::component_weight_bytes(folder, "transformer");
  r.weights_gib = gib(static_cast<double>(bytes));
  r.available_gib = gib(static_cast<double>(device::available_bytes(device)));
  bool stream = o.stream == "on";
  if (o.stream == "auto") stream = static_cast<double>(bytes) > 0.8 * r.available_gib * (1 << 30);
  log("transformer weights " + fmt("%.1f GiB", r.weights_gib) + ", " +
      fmt("%.1f GiB", r.available_gib) + " available: " + (stream ? "streamed" : "resident"));

  double peak = 0;
  StagePeak load_peak(&peak);
  const double t0 = now_s();
  auto model = models::load_hidream_transformer(folder, device, dtype, "transformer", stream);
  r.load_s = now_s() - t0;
  r.load_peak_rss_gib = load_peak.finish() / 1024.0;
  r.streamed = model->stream != nullptr;
  if (model->stream) {
    r.zero_copy = model->stream->zero_copy();
    r.streamed_gib = gib(static_cast<double>(model->stream->streamed_bytes()));
  }
  log("loaded in " + fmt("%.1f s", r.load_s) + " (peak RSS " +
      fmt("%.2f GiB", r.load_peak_rss_gib) + ")");

  const auto& c = model->config();
  const int64_t f = 8 * c.patch_size;
  if (o.width % f || o.height % f || o.width < f || o.height < f)
    throw InvalidArgument("-W/-H must be positive multiples of " + std::to_string(f));
  const int64_t h = o.height / 8, w = o.width / 8;
  r.image_tokens = static_cast<int>(h * w / (c.patch_size * c.patch_size));
  torch::manual_seed(static_cast<int64_t>(o.seed));
  const auto opts = torch::TensorOptions().dtype(dtype);
  int64_t llama_stack = 0;
  for (auto i : c.llama_layers) llama_stack = std::max(llama_stack, i + 1);
  auto x = torch::randn({o.batch, c.in_channels, h, w}, opts);
  auto t = torch::full({o.batch}, 500.0);
  auto t5 = torch::randn({o.batch, o.text_tokens, c.caption_channels[0]}, opts);
  auto llama = torch::randn({llama_stack, o.batch, o.text_tokens, c.caption_channels[1]}, opts);
  auto pooled = torch::randn({o.batch, c.text_emb_dim}, opts);
  StagePeak step_peak(&peak);
  const double s0 = now_s();
  auto out = model->forward(x, t, t5, llama, pooled);
  sync_device(device);
  r.step_s = now_s() - s0;
  r.step_peak_rss_gib = step_peak.finish() / 1024.0;
  if (!torch::isfinite(out).all().item<bool>())
    throw NumericalError("bench hidream-stream: the transformer's output is not finite");
  log("one step (" + std::to_string(o.batch) + " x " + std::to_string(r.image_tokens) +
      " image tokens) in " + fmt("%.1f s", r.step_s) + " (peak RSS " +
      fmt("%.2f GiB", r.step_peak_rss_gib) + ")");
  return r;
}

}  // namespace diffuse::bench
