#include "bench/attention_bench.h"

#include <torch/torch.h>

#include <chrono>

#include "bench/bench_util.h"

#include "bench/memory_probe.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "nn/attention/flash.h"

namespace diffuse::bench {
std::vector<AttentionCase> attention_cases(const std::string& set) {
  std::vector<AttentionCase> out;
  if (set == "table" || set == "all") {
    for (int64_t n : {256, 512, 1024})
      out.push_back({"seq " + std::to_string(n) + ", hidden 768, 12 heads", 1, 12, n, n, 64});
  }
  if (set == "sd" || set == "all") {
    out.push_back({"SD2.1 512px self (64x64 tokens)", 2, 5, 4096, 4096, 64});
    out.push_back({"SD2.1 512px self (32x32 tokens)", 2, 10, 1024, 1024, 64});
    out.push_back({"SD2.1 512px cross (77 keys)", 2, 5, 4096, 77, 64});
    out.push_back({"SD2.1 768px self (96x96 tokens)", 2, 5, 9216, 9216, 64});
    out.push_back({"SD2.1 768px cross (77 keys)", 2, 5, 9216, 77, 64});
    out.push_back({"SD2 text encoder (causal)", 2, 16, 77, 77, 64, true});
  }
  if (out.empty())
    throw InvalidArgument("unknown attention case set '" + set + "' (expected table, sd or all)");
  return out;
}

std::vector<AttentionBenchRow> run_attention_bench(const std::vector<AttentionCase>& cases,
                                                   const AttentionBenchOptions& o) {
  torch::InferenceMode guard;
  device::configure_cpu_threads();
  const torch::Device device = device::resolve_device(o.device);
  auto backends = o.backends;
  if (backends.empty()) backends = nn::available_attention_backends(device);
  std::vector<AttentionBenchRow> rows;
  for (const auto& c : cases) {
    for (auto dtype : o.dtypes) {
      auto gen = at::detail::createCPUGenerator(42);
      auto make = [&](int64_t n) {
        // [B, N, H, D] memory viewed as [B, H, N, D], as the models hand it over.
        return torch::randn({c.batch, n, c.heads, c.head_dim}, gen, torch::kFloat32)
            .to(device, dtype)
            .transpose(1, 2);
      };
      auto q = make(c.nq), k = make(c.nk), v = make(c.nk);
      const double flop = 4.0 * c.batch * c.heads * c.nq * c.nk * c.head_dim;
      for (auto b : backends) {
        AttentionBenchRow row;
        row.c = c;
        row.dtype = device::dtype_name(dtype);
        row.backend = nn::attention_backend_name(b);
        if (b == nn::AttentionBackend::kFlash) row.kernel = nn::flash_kernel_name(dtype);
        const double score_gb =
            2.0 * c.batch * c.heads * c.nq * c.nk * 4 / 1e9;  // scores + probs, fp32
        if (b == nn::AttentionBackend::kMath && score_gb > o.max_memory_gb) {
          row.skipped = true;
          row.note = "scores need ~" + std::to_string(static_cast<int>(score_gb)) +
                     " GB (> --max-memory-gb)";
          rows.push_back(row);
          if (o.log) o.log(c.name + " " + row.dtype + " " + row.backend + ": skipped, " + row.note);
          continue;
        }
        nn::AttentionOptions opts;
        opts.backend = b;
        opts.causal = c.causal;
        try {
          device::empty_cache(torch::Device(torch::kCPU), device::HeapRelease::kAll);
          const bool reset = reset_peak_rss();
          const int64_t before = current_rss_bytes();
          // An accelerator queues the kernels: the clock reads only after they have run.
          sync_device(device);
          double t0 = now_s();
          nn::attention(q, k, v, opts);
          sync_device(device);
          double first = now_s() - t0;
          row.peak_extra_mb =
              reset ? static_cast<double>(peak_rss_bytes() - before) / (1 << 20) : -1;
          double best = first, spent = first;
          for (int i = 0; i < o.repeat && spent < o.max_seconds; ++i) {
            t0 = now_s();
            nn::attention(q, k, v, opts);
            sync_device(device);
            double dt = now_s() - t0;
            best = std::min(best, dt);
            spent += dt;
          }
          row.seconds = best;
          row.gflops = flop / best / 1e9;
        } catch (const std::exception& e) {
          row.skipped = true;
          row.note = e.what();
        }
        rows.push_back(row);
        if (o.log) {
          char buf[256];
          if (row.skipped)
            snprintf(buf, sizeof buf, "%s %s %s: skipped (%s)", c.name.c_str(), row.dtype.c_str(),
                     row.backend.c_str(), row.note.c_str());
          else
            snprintf(buf, sizeof buf, "%s %s %s: %.4f s, %.1f GFLOP/s, +%.0f MiB", c.name.c_str(),
                     row.dtype.c_str(), row.backend.c_str(), row.seconds, row.gflops,
                     row.peak_extra_mb);
          o.log(buf);
        }
      }
    }
  }
  return rows;
}

}  // namespace diffuse::bench
