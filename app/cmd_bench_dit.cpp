// `diffuse bench --arch hidream-i1 | flux-dev | flux-schnell | qwen-image | t5-xxl | llama-3.1-8b`:
// prints the DiT block benchmark (bench/dit_block_bench.h) and the large text encoders'
// (bench/text_encoder_bench.h).
#include <cstdio>
#include <iostream>

#include "bench/dit_block_bench.h"
#include "bench/text_encoder_bench.h"
#include "commands.h"

namespace diffuse::app {
namespace {

void print_block(const char* name, const bench::BlockTiming& t) {
  std::printf(
      "  %-20s %7.0fM params  %8.1f GFLOP (attention %6.1f)  best %7.3f s  mean %7.3f s"
      "  %6.1f GFLOP/s  %5.0f%% of roofline (%.2fx)  peak RSS %7.0f MiB",
      name, t.params_m, t.flops.total() / 1e9, t.flops.attention / 1e9, t.best_s, t.mean_s,
      t.flops.total() / 1e9 / t.best_s, 100 * t.roofline_fraction,
      t.roofline_fraction > 0 ? 1 / t.roofline_fraction : 0.0, t.peak_mb);
  if (t.device_peak_mb > 0) std::printf(", on the device %7.0f MiB", t.device_peak_mb);
  std::printf("\n");
}

}  // namespace

int run_dit_block_bench(const bench::PipelineBenchOptions& p, bool as_json) {
  bench::DitBlockBenchOptions o;
  o.arch = p.arch;
  o.device = p.load.device;
  o.dtype = p.load.dtype;
  o.attention = p.load.attention;
  if (p.width > 0) o.width = p.width;
  if (p.height > 0) o.height = p.height;
  o.batch = p.batch;
  o.repeat = p.steps;
  o.roofline = p.roofline;
  o.seed = p.seed;
  o.weights = p.load.weights;
  if (!as_json) o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto r = bench::run_dit_block_bench(o);
  if (as_json) {
    std::cout << bench::to_json(r).dump(2) << "\n";
    return 0;
  }
  std::printf(
      "%s blocks at %dx%d (%d image + %d text tokens), batch %d, %s, %s "
      "attention, %d threads on %s\n",
      r.arch.c_str(), r.width, r.height, r.image_tokens, r.text_tokens, r.batch, r.dtype.c_str(),
      r.attention.c_str(), r.threads, r.device.c_str());
  if (r.roofline) std::printf("  roofline: matmul %.1f GFLOP/s\n", r.roofline->matmul_gflops);
  print_block("dual-stream block", r.dual);
  if (r.num_single_layers > 0) print_block("single-stream block", r.single);
  std::printf("  one denoising step (%d dual + %d single blocks): ~%.1f s per %d-image batch\n",
              r.num_layers, r.num_single_layers, r.step_estimate_s, r.batch);
  std::printf("  whole transformer: %.2fB parameters = %.1f GiB in %s\n", r.transformer_params_b,
              r.transformer_gib, r.dtype.c_str());
  if (r.dual_quantized) {
    const std::string w = r.weights;
    std::vector<const bench::QuantizedBlockTiming*> kinds{&*r.dual_quantized};
    if (r.single_quantized) kinds.push_back(&*r.single_quantized);
    for (const auto* q : kinds) {
      const bool dual = q == &*r.dual_quantized;
      print_block(dual ? "dual-stream block" : "single-stream", q->timing);
      const auto& plain = dual ? r.dual : r.single;
      char how[128];
      if (q->integer_products)
        std::snprintf(how, sizeof how, "multiplied in 8-bit integers, nothing dequantized");
      else
        std::snprintf(how, sizeof how,
                      "dequantizing its weights once: %.3f s = %.1f %% of the plain block",
                      q->dequantize_s, 100 * q->dequantize_s / plain.best_s);
      std::printf(
          "    %s: block weights %.0f -> %.0f MiB (%.1f %%), linear layers %.0f -> %.0f MiB; "
          "time %.2fx of plain (%s); output relative error %.2e\n",
          w.c_str(), q->block_plain_mb, q->block_quantized_mb,
          100 * q->block_quantized_mb / q->block_plain_mb, q->plain_mb, q->quantized_mb,
          q->timing.best_s / plain.best_s, how, q->relative_error);
    }
    std::printf(
        "  with %s weights: one step ~%.1f s (%.2fx of plain), whole transformer %.1f GiB "
        "(%.1f %% of %s)\n",
        w.c_str(), r.step_estimate_quantized_s, r.step_estimate_quantized_s / r.step_estimate_s,
        r.transformer_quantized_gib, 100 * r.transformer_quantized_gib / r.transformer_gib,
        r.dtype.c_str());
  }
  return 0;
}

}  // namespace diffuse::app

namespace diffuse::app {

int run_text_encoder_bench(const bench::PipelineBenchOptions& p, bool as_json) {
  bench::TextEncoderBenchOptions o;
  o.arch = p.arch;
  o.device = p.load.device;
  o.dtype = p.load.dtype;
  o.batch = p.batch;
  o.repeat = p.steps;
  o.seed = p.seed;
  if (!as_json) o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto r = bench::run_text_encoder_bench(o);
  if (as_json) {
    std::cout << bench::to_json(r).dump(2) << "\n";
    return 0;
  }
  std::printf("%s: %.2fB parameters = %.1f GiB in %s on %s (%.1f GiB available)\n", r.arch.c_str(),
              r.params_b, r.weights_gib, r.dtype.c_str(), r.device.c_str(), r.available_gib);
  if (r.skipped) {
    std::printf("  skipped: %s\n", r.skip_reason.c_str());
    return 0;
  }
  std::printf(
      "  built in %.1f s; forward of %d x %d tokens: %.2f s (%d threads); peak RSS %.1f GiB\n",
      r.build_s, r.batch, r.tokens, r.best_s, r.threads, r.peak_gib);
  return 0;
}

}  // namespace diffuse::app
