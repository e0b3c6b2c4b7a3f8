// `diffuse bench` (pipeline stages at real model sizes), `diffuse bench attention` (attention
// backends) and `diffuse bench roofline` (this machine's matmul/conv throughput).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/attention_bench.h"
#include "bench/bench_util.h"
#include "bench/dit_block_bench.h"
#include "bench/pipeline_bench.h"
#include "bench/precision_bench.h"
#include "bench/roofline.h"
#include "bench/text_encoder_bench.h"
#include "commands.h"
#include "device/cpu_load.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "flag_checks.h"
#include "models/builtin_configs.h"
#include "nn/attention.h"

namespace diffuse::app {
namespace {

using nlohmann::json;

// The benchmarks' printf-style number formatting, under the short name this report uses.
constexpr auto f = bench::fmt;

// "; steps 12.100-14.900 s, median 13.000" for two or more timed steps: how much the machine moved
// during the run (a shared VM's rates can move by 10-20 % within minutes), "" otherwise.
std::string spread(const std::vector<double>& step_s) {
  if (step_s.size() < 2) return "";
  const auto [lo, hi] = std::minmax_element(step_s.begin(), step_s.end());
  return "; steps " + f("%.3f", *lo) + "-" + f("%.3f s", *hi) + ", median " +
         f("%.3f", bench::median(step_s));
}

json roofline_json(const bench::Roofline& r) {
  json entries = json::array();
  for (const auto& e : r.entries)
    entries.push_back({{"kind", e.kind},
                       {"shape", e.shape},
                       {"gflop", e.gflop},
                       {"seconds", e.seconds},
                       {"gflops", e.gflops()}});
  return {{"device", r.device},
          {"dtype", r.dtype},
          {"channels_last", r.channels_last},
          {"matmul_gflops", r.matmul_gflops},
          {"conv_gflops", r.conv_gflops},
          {"entries", entries}};
}

void print_roofline(const bench::Roofline& r) {
  std::cout << "roofline " << r.device << " " << r.dtype
            << (r.channels_last ? " (channels-last conv)" : "") << "\n";
  for (const auto& e : r.entries)
    std::printf("  %-6s %-36s %8.2f GFLOP  %8.4f s  %8.1f GFLOP/s\n", e.kind.c_str(),
                e.shape.c_str(), e.gflop, e.seconds, e.gflops());
  std::printf("  best: matmul %.1f GFLOP/s, conv %.1f GFLOP/s\n", r.matmul_gflops, r.conv_gflops);
}

json unet_run_json(const bench::UNetRun& u) {
  return {{"dtype", u.dtype},
          {"attention", u.attention},
          {"step_s", u.step_s},
          {"step_mean_s", u.step_mean_s},
          {"step_min_s", u.step_min_s},
          {"step_median_s", u.step_median_s},
          {"cpu", device::cpu_share_json(u.cpu)},
          {"graph", u.graph},
          {"graph_identical", u.graph_identical},
          {"graph_max_abs_diff", u.graph_max_abs_diff}};
}

// "; other processes used 0.1 of 2 CPUs" while the timed steps ran: with the spread, how far
// the numbers are this machine's best; "" where unknown.
std::string load_text(const CpuShare& s) {
  return s.others < 0 ? "" : "; " + device::describe_cpu_share(s);
}

// " (700.2 by Winograd)" when some of the convolutions ran by Winograd, "" otherwise.
std::string winograd_text(const bench::FlopCounts& c) {
  return c.conv_winograd > 0 ? " (" + f("%.1f", c.conv_winograd / 1e9) + " by Winograd)" : "";
}

// One memory figure (MiB) per stage of the pipeline bench.
json by_stage(double build, double text_encoder, double unet, double vae_decode) {
  return {
      {"build", build}, {"text_encoder", text_encoder}, {"unet", unet}, {"vae_decode", vae_decode}};
}

// With --fail-above R: 1 when the step took more than R times its roofline limit (a slowdown
// against the ratio a release measured on this kind of machine), after the report.
int regression_gate(const bench::PipelineBenchResult& r, std::optional<double> fail_above) {
  if (!fail_above) return 0;
  if (r.roofline_fraction <= 0) {
    std::cerr << "error: --fail-above needs the UNet step and the roofline (no --no-unet or "
                 "--no-roofline)\n";
    return 1;
  }
  const double ratio = 1 / r.roofline_fraction;
  if (ratio <= *fail_above) return 0;
  std::cerr << "FAIL: the UNet step took " << c10::str(ratio) << "x its roofline limit, above "
            << "--fail-above " << c10::str(*fail_above) << "\n";
  return 1;
}

int run_pipeline(const bench::PipelineBenchOptions& opts_in, bool as_json,
                 std::optional<double> fail_above) {
  auto o = opts_in;
  if (!as_json) o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  auto r = bench::run_pipeline_bench(o);
  const double step = r.unet.step_mean_s;
  if (as_json) {
    json j = {
        {"arch", r.arch},
        {"model", r.model},
        {"device", r.device},
        {"dtype", r.dtype},
        {"text_encoder_dtype", r.text_encoder_dtype},
        {"vae_dtype", r.vae_dtype},
        {"attention", r.attention},
        {"attention_self", r.attention_self},
        {"attention_cross", r.attention_cross},
        {"width", r.width},
        {"height", r.height},
        {"batch", r.batch},
        {"threads", r.threads},
        {"build_s", r.build_s},
        {"text_encoder_s", r.text_encoder_s},
        {"unet_step_s", step},
        {"unet_steps_s", r.unet.step_s},
        {"steps_per_s", step > 0 ? 1.0 / step : 0.0},
        {"vae_decode_s", r.vae_decode_s},
        {"vae_gflop", r.vae_flops.total() / 1e9},
        {"vae_gflop_by_kind",
         {{"conv", r.vae_flops.conv / 1e9},
          {"conv_winograd", r.vae_flops.conv_winograd / 1e9},
          {"matmul", r.vae_flops.matmul / 1e9},
          {"attention", r.vae_flops.attention / 1e9}}},
        {"vae_roofline_limit_s", r.vae_roofline_limit_s},
        {"peak_rss_mb", r.peak_rss_mb},
        {"peak_rss_mb_by_stage",
         by_stage(r.build_peak_mb, r.text_encoder_peak_mb, r.unet_peak_mb, r.vae_peak_mb)},
        {"device_peak_mb", r.device_peak_mb},
        {"device_peak_mb_by_stage", by_stage(r.build_device_peak_mb, r.text_encoder_device_peak_mb,
                                             r.unet_device_peak_mb, r.vae_device_peak_mb)},
        {"models_rss_mb", r.models_rss_mb},
        {"packed_weights_mb", r.packed_weights_mb},
        {"params_m",
         {{"unet", r.unet_params_m},
          {"text_encoder", r.text_encoder_params_m},
          {"vae", r.vae_params_m}}},
        {"unet_gflop", r.unet_flops.total() / 1e9},
        {"unet_gflop_by_kind",
         {{"conv", r.unet_flops.conv / 1e9},
          {"conv_winograd", r.unet_flops.conv_winograd / 1e9},
          {"matmul", r.unet_flops.matmul / 1e9},
          {"attention", r.unet_flops.attention / 1e9}}},
        {"unet_gflops", step > 0 ? r.unet_flops.total() / 1e9 / step : 0.0}};
    if (r.roofline) {
      j["roofline"] = roofline_json(*r.roofline);
      j["roofline_limit_s"] = r.roofline_limit_s;
      j["roofline_fraction"] = r.roofline_fraction;
    }
    if (r.vae_roofline) j["vae_roofline"] = roofline_json(*r.vae_roofline);
    if (r.whole_image) {
      const auto& w = *r.whole_image;
      j["whole_image"] = {
          {"steps", w.steps},
          {"scheduler", w.scheduler},
          {"weights_cached_before_load", w.cache_before_load.fraction()},
          {"weights_bytes", w.cache_before_load.bytes},
          {"load_s", w.load_s},
          {"warm_load_s", w.warm_load_s},
          {"text_encode_s", w.text_encode_s},
          {"denoise_s", w.denoise_s},
          {"step_s", w.step_s},
          {"cpu", device::cpu_share_json(w.cpu)},
          {"vae_decode_s", w.vae_decode_s},
          {"generate_s", w.generate_s},
          {"first_generate_s", w.first_generate_s},
          {"generate_runs_s", w.generate_runs_s},
          {"limit_s", r.whole_image_limit_s},
          {"roofline",
           r.whole_image_roofline ? roofline_json(*r.whole_image_roofline) : nlohmann::json()},
          {"ratio", r.whole_image_limit_s > 0 ? w.generate_s / r.whole_image_limit_s : 0.0},
          {"peak_rss_mb", w.peak_rss_mb}};
    }
    if (o.unet) j["unet"] = unet_run_json(r.unet);
    if (r.baseline) {
      j["baseline"] = unet_run_json(*r.baseline);
      j["speedup_vs_baseline"] = step > 0 ? r.baseline->step_mean_s / step : 0.0;
    }
    if (o.profile) {
      json kinds = json::array(), ops = json::array();
      for (const auto& k : r.profile_kinds)
        kinds.push_back({{"kind", k.name}, {"seconds", k.seconds}, {"calls", k.calls}});
      for (const auto& k : r.profile_ops)
        ops.push_back({{"op", k.name}, {"seconds", k.seconds}, {"calls", k.calls}});
      j["profile"] = {{"step_s", r.profile_step_s}, {"by_kind", kinds}, {"longest_ops", ops}};
    }
    std::cout << j.dump(2) << "\n";
    return regression_gate(r, fail_above);
  }
  std::cout << (r.arch.empty() ? r.model : r.arch) << " at " << r.width << "x" << r.height << " on "
            << r.device << " (" << r.threads << (r.threads == 1 ? " thread" : " threads")
            << "): unet " << r.dtype << ", text encoder " << r.text_encoder_dtype << ", vae "
            << r.vae_dtype << ", attention " << r.attention << " (self: " << r.attention_self
            << ", cross: " << r.attention_cross << ")\n";
  if (o.text_encoder)
    std::cout << "  text encoder (batch " << r.batch << ")   " << f("%8.3f s", r.text_encoder_s)
              << "\n";
  if (o.unet)
    std::cout << "  unet step (batch " << r.batch << ")      " << f("%8.3f s", step) << "  ("
              << f("%.3f steps/s", step > 0 ? 1 / step : 0) << ", "
              << f("%.1f GFLOP", r.unet_flops.total() / 1e9) << " = conv "
              << f("%.1f", r.unet_flops.conv / 1e9) << winograd_text(r.unet_flops) << " + matmul "
              << f("%.1f", r.unet_flops.matmul / 1e9) << " + attention "
              << f("%.1f", r.unet_flops.attention / 1e9) << ", "
              << f("%.1f GFLOP/s", step > 0 ? r.unet_flops.total() / 1e9 / step : 0)
              << spread(r.unet.step_s) << load_text(r.unet.cpu) << ")\n";
  if (o.unet && r.unet.graph)
    std::cout << "  unet step as graph      replayed; output "
              << (r.unet.graph_identical ? "bit-identical to the eager step"
                                         : "differs from the eager step by up to " +
                                               f("%.3g", r.unet.graph_max_abs_diff))
              << "\n";
  if (o.vae) {
    std::cout << "  vae decode (1 image)    " << f("%8.3f s", r.vae_decode_s) << "  ("
              << f("%.1f GFLOP", r.vae_flops.total() / 1e9) << " = conv "
              << f("%.1f", r.vae_flops.conv / 1e9) << winograd_text(r.vae_flops) << " + matmul "
              << f("%.1f", r.vae_flops.matmul / 1e9) << " + attention "
              << f("%.1f", r.vae_flops.attention / 1e9) << ", "
              << f("%.1f GFLOP/s",
                   r.vae_decode_s > 0 ? r.vae_flops.total() / 1e9 / r.vae_decode_s : 0)
              << ")\n";
    if (r.vae_roofline_limit_s > 0)
      std::cout << "  vae decode limit        " << f("%8.3f s", r.vae_roofline_limit_s)
                << "  (the roofline's rates in " << r.vae_dtype << "; the decode takes "
                << f("%.2fx", r.vae_decode_s / r.vae_roofline_limit_s) << " the limit)\n";
  }
  std::cout << "  peak RSS                " << f("%8.0f MiB", r.peak_rss_mb)
            << "  (models built: " << f("%.0f MiB", r.models_rss_mb) << "; peaks: build "
            << f("%.0f", r.build_peak_mb) << ", text " << f("%.0f", r.text_encoder_peak_mb)
            << ", unet " << f("%.0f", r.unet_peak_mb) << ", vae " << f("%.0f MiB", r.vae_peak_mb)
            << (r.packed_weights_mb > 0
                    ? "; packed convolution weights " + f("%.0f MiB", r.packed_weights_mb)
                    : std::string())
            << ")\n";
  if (r.device_peak_mb > 0) {
    std::string label = "peak on " + r.device;
    label.resize(std::max<size_t>(label.size(), 24), ' ');
    std::cout << "  " << label << f("%8.0f MiB", r.device_peak_mb)
              << "  (held by tensors; peaks: build " << f("%.0f", r.build_device_peak_mb)
              << ", text " << f("%.0f", r.text_encoder_device_peak_mb) << ", unet "
              << f("%.0f", r.unet_device_peak_mb) << ", vae " << f("%.0f MiB", r.vae_device_peak_mb)
              << ")\n";
  }
  if (r.roofline) {
    std::cout << "  roofline: matmul " << f("%.1f", r.roofline->matmul_gflops) << " GFLOP/s, conv "
              << f("%.1f", r.roofline->conv_gflops) << " GFLOP/s -> step limit "
              << f("%.3f s", r.roofline_limit_s) << "; the step runs at "
              << f("%.0f%%", 100 * r.roofline_fraction) << " of it ("
              << f("%.2fx", r.roofline_fraction > 0 ? 1 / r.roofline_fraction : 0)
              << " the limit)\n";
    if (r.unet_flops.conv_winograd > 0 || r.vae_flops.conv_winograd > 0)
      std::cout
          << "  (the limits count every convolution's direct FLOPs; the Winograd ones multiply "
             "2.25-4x less, so a stage may run below 1x)\n";
  }
  if (r.whole_image) {
    const auto& w = *r.whole_image;
    const double denoise_steps = static_cast<double>(std::max<size_t>(w.step_s.size(), 1));
    std::cout << "  whole image, " << w.steps << " steps " << w.scheduler << ": load "
              << f("%.2f s", w.load_s) << " (" << f("%.0f%%", 100 * w.cache_before_load.fraction())
              << " of " << f("%.2f GiB", static_cast<double>(w.cache_before_load.bytes) / (1 << 30))
              << " cached before; again, warm and into the memory the first load freed, "
              << f("%.2f s", w.warm_load_s) << "), then " << f("%.2f s", w.generate_s) << " = text "
              << f("%.2f", w.text_encode_s) << " + denoise " << f("%.2f", w.denoise_s) << " ("
              << f("%.3f s/step", w.denoise_s / denoise_steps) << spread(w.step_s)
              << load_text(w.cpu) << ") + decode " << f("%.2f", w.vae_decode_s) << "\n";
    if (w.generate_runs_s.size() > 1)
      std::cout << "  whole image, " << w.generate_runs_s.size()
                << " runs: the median of runs 2.. above; the first took "
                << f("%.2f s", w.first_generate_s) << " (one-time costs)\n";
    if (r.whole_image_limit_s > 0)
      std::cout << "  whole image limit       " << f("%8.3f s", r.whole_image_limit_s) << "  ("
                << w.steps
                << " x step limit + decode limit at the best rates measured before and after it: "
                << "matmul " << f("%.1f", r.whole_image_roofline->matmul_gflops) << ", conv "
                << f("%.1f", r.whole_image_roofline->conv_gflops) << " GFLOP/s; the image takes "
                << f("%.2fx", w.generate_s / r.whole_image_limit_s) << " the limit)\n";
  }
  if (r.baseline)
    std::cout << "  baseline unet step (fp32, math attention) "
              << f("%.3f s", r.baseline->step_mean_s) << " -> "
              << f("%.2fx", step > 0 ? r.baseline->step_mean_s / step : 0) << " faster\n";
  if (o.profile) {
    // The kinds the roofline counts (conv, matmul, attention) against what it does not.
    double inside = 0;
    for (const auto& k : r.profile_kinds) inside += k.seconds;
    auto pad = [](std::string s) {
      return s.size() < 12 ? s + std::string(12 - s.size(), ' ') : s;
    };
    std::cout << "  profiled unet step " << f("%.3f s", r.profile_step_s)
              << ", by operator kind:\n";
    for (const auto& k : r.profile_kinds)
      std::cout << "    " << pad(k.name) << f("%8.3f s", k.seconds)
                << f("  %5.1f%%", 100 * k.seconds / r.profile_step_s)
                << f("  (%.0f calls)", static_cast<double>(k.calls)) << "\n";
    std::cout << "    " << pad("outside ops") << f("%8.3f s", r.profile_step_s - inside)
              << f("  %5.1f%%", 100 * (r.profile_step_s - inside) / r.profile_step_s) << "\n";
    std::cout << "  longest operators:";
    for (const auto& k : r.profile_ops)
      std::cout << " " << k.name << " " << f("%.3f s", k.seconds) << ";";
    std::cout << "\n";
  }
  return regression_gate(r, fail_above);
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench::PipelineBenchOptions>();
  auto as_json = std::make_shared<bool>(false);
  std::string archs;
  for (const auto& n : models::builtin_arch_names()) archs += (archs.empty() ? "" : "|") + n;
  app.add_option(
         "--arch", o->arch,
         "Built-in architecture with random weights: " + archs +
             "|hidream-i1|flux-dev|flux-schnell|qwen-image (one dual- and one single-stream block "
             "at full size)"
             "|t5-xxl|llama-3.1-8b (HiDream's text encoders, one forward)")
      ->capture_default_str();
  app.add_option("-m,--model", o->model,
                 "Benchmark a real model (diffusers folder or single file) instead");
  app.add_option("--device", o->load.device, "auto|cpu|cuda[:N]|npu[:N]")->capture_default_str();
  app.add_option("--dtype", o->load.dtype, "auto|fp32|bf16|fp16 for text encoder and UNet")
      ->capture_default_str();
  app.add_option("--vae-dtype", o->load.vae_dtype, "auto|fp32|bf16|fp16 for the VAE")
      ->capture_default_str();
  app.add_option("--weights", o->load.weights,
                 "none|q8_0|q4_0|int8: the UNet's and VAE's linear and convolution weights kept "
                 "quantized (as txt2img --weights); with a DiT --arch each block is timed plain "
                 "and then quantized, side by side")
      ->capture_default_str();
  app.add_option("--attention", o->load.attention,
                 "auto|math|sdpa|flash|npu (env DIFFUSE_ATTENTION)")
      ->capture_default_str();
  // The same limits as txt2img: a benchmark allocates what a generation of that size would.
  app.add_option("-W,--width", o->width, "Width in pixels (default: the model's)")
      ->check(int_range(8, 8192, "a width in pixels"));
  app.add_option("-H,--height", o->height, "Height in pixels (default: the model's)")
      ->check(int_range(8, 8192, "a height in pixels"));
  app.add_option("--steps", o->steps, "Timed UNet steps (after the warm-up steps)")
      ->capture_default_str()
      ->check(int_range(1, 10000, "a number of steps"));
  app.add_option("--warmup", o->warmup, "Untimed UNet steps first")
      ->capture_default_str()
      ->check(int_range(0, 10000, "a number of steps"));
  auto* batch = app.add_option("--batch", o->batch,
                               "UNet/transformer batch (2 = one image with guidance; FLUX, whose "
                               "guidance is an embedding, runs 1 unless given)")
                    ->capture_default_str()
                    ->check(int_range(1, 256, "a batch size"));
  app.add_option("--seed", o->seed, "Seed of the random weights and inputs")->capture_default_str();
  app.add_flag(
      "--no-pack-weights", [o](int64_t) { o->load.pack_conv_weights = false; },
      "Let oneDNN reorder the UNet's low-resolution convolution weights at every call "
      "instead of keeping a packed copy (as txt2img --no-pack-weights)");
  app.add_flag("--baseline", o->baseline,
               "Also time a float32 UNet step with math attention and report the speed-up");
  app.add_flag("--profile", o->profile,
               "Also run one UNet step under an operator profile: its time by operator kind");
  app.add_flag("--graph", o->graph,
               "CUDA / Ascend npu: time the UNet step replayed from a device graph (checked bit "
               "for bit against "
               "the eager step first); with --whole-image, generate with txt2img --graph");
  app.add_option("--whole-image-runs", o->whole_image_runs,
                 "Generations for --whole-image: the first is reported apart (one-time costs), "
                 "the median of the others is the image's time")
      ->check(int_range(1, 100, "a run count"))
      ->capture_default_str();
  app.add_option("--whole-image", o->whole_image_steps,
                 "With -m FOLDER: first generate one image of this many steps (DPM++ 2M) through "
                 "the pipeline, load timed cold/warm, and put it against the step and decode "
                 "limits")
      ->check(int_range(1, 1000, "a step count"));
  auto fail_above = std::make_shared<std::optional<double>>();
  app.add_option("--fail-above", *fail_above,
                 "Exit 1 when the UNet step takes more than this many times its roofline limit "
                 "(a regression check; see the README for the ratios measured per machine)")
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--no-text-encoder", [o](int64_t) { o->text_encoder = false; }, "Skip the text encoder");
  app.add_flag(
      "--no-unet", [o](int64_t) { o->unet = false; }, "Skip the UNet steps");
  app.add_flag(
      "--no-vae", [o](int64_t) { o->vae = false; }, "Skip the VAE decode");
  app.add_flag(
      "--no-roofline", [o](int64_t) { o->roofline = false; }, "Skip the roofline measurement");
  app.add_flag("--json", *as_json, "Print one JSON object on stdout");

  struct AttentionFlags {
    std::string set = "all", device = "cpu", dtype = "all";
    std::vector<std::string> backends;
    int repeat = 3;
    double max_memory_gb = 8;
    bool json = false;
  };
  auto af = std::make_shared<AttentionFlags>();
  CLI::App* att = app.add_subcommand("attention", "Time and peak memory of each attention backend");
  att->add_option("--cases", af->set, "table|sd|all")->capture_default_str();
  att->add_option("--device", af->device, "Device")->capture_default_str();
  att->add_option("--dtype", af->dtype, "fp32|bf16|all")->capture_default_str();
  att->add_option("--backend", af->backends,
                  "Only this backend (repeatable; default: all available)");
  att->add_option("--repeat", af->repeat, "Timed calls per case after a warm-up (best is reported)")
      ->capture_default_str();
  att->add_option("--max-memory-gb", af->max_memory_gb,
                  "Skip math cases whose score matrices exceed this")
      ->capture_default_str();
  att->add_flag("--json", af->json, "Print one JSON object on stdout");

  struct RooflineFlags {
    std::string device = "auto", dtype = "all";
    bool json = false;
  };
  auto rf = std::make_shared<RooflineFlags>();
  CLI::App* roof =
      app.add_subcommand("roofline", "Matmul and convolution throughput of this machine per dtype");
  roof->add_option("--device", rf->device, "Device")->capture_default_str();
  roof->add_option("--dtype", rf->dtype, "fp32|bf16|all")->capture_default_str();
  roof->add_flag("--json", rf->json, "Print one JSON object on stdout");
  auto pf = std::make_shared<bench::PrecisionOptions>();
  auto pjson = std::make_shared<bool>(false);
  CLI::App* prec = app.add_subcommand(
      "precision", "PSNR of a dtype/attention setting vs float32 on golden pipeline cases");
  prec->add_option("--golden", pf->golden, "Golden set folder (with cases.json)")->required();
  prec->add_option("--device", pf->device, "Device")->capture_default_str();
  prec->add_option("--dtype", pf->dtype, "dtype under test for text encoder and UNet")
      ->capture_default_str();
  prec->add_option("--vae-dtype", pf->vae_dtype, "VAE dtype under test")->capture_default_str();
  prec->add_option("--attention", pf->attention, "Attention backend under test")
      ->capture_default_str();
  prec->add_flag("--json", *pjson, "Print one JSON object on stdout");
  const auto demo_quality = add_bench_demo_quality(app);
  const auto accel = add_bench_accel(app);
  const auto lora = add_bench_lora(app);
  const auto stream = add_bench_hidream_stream(app);
  const auto vae_tiling = add_bench_vae_tiling(app);
  const auto gemm = add_bench_gemm(app);
  const auto parallel_ranks = add_bench_parallel(app);
  app.require_subcommand(0, 1);

  auto dtypes_for = [](const std::string& spec, const torch::Device& device) {
    std::vector<torch::Dtype> out;
    if (spec == "all") {
      out.push_back(torch::kFloat32);
      if (device::probe_dtype(device, torch::kBFloat16)) out.push_back(torch::kBFloat16);
    } else {
      out.push_back(device::resolve_dtype(spec, device, "unet"));
    }
    return out;
  };

  return [o, as_json, batch, att, af, roof, rf, prec, pf, pjson, dtypes_for, demo_quality, lora,
          stream, accel, vae_tiling, gemm, parallel_ranks, fail_above]() {
    if (demo_quality.first->parsed()) return demo_quality.second();
    if (accel.first->parsed()) return accel.second();
    if (lora.first->parsed()) return lora.second();
    if (stream.first->parsed()) return stream.second();
    if (vae_tiling.first->parsed()) return vae_tiling.second();
    if (gemm.first->parsed()) return gemm.second();
    if (parallel_ranks.first->parsed()) return parallel_ranks.second();
    if (prec->parsed()) {
      auto po = *pf;
      if (!*pjson) po.log = [](const std::string& line) { std::cerr << line << "\n"; };
      auto rows = bench::run_precision_bench(po);
      double worst = std::numeric_limits<double>::infinity();
      json out = json::array();
      for (const auto& r : rows) {
        worst = std::min(worst, r.psnr_db);
        out.push_back({{"case", r.case_name},
                       {"psnr_db", std::isfinite(r.psnr_db) ? json(r.psnr_db) : json("inf")},
                       {"max_abs_diff", r.max_abs_diff},
                       {"golden_max_abs_err", r.golden_max_abs_err}});
      }
      if (*pjson) {
        std::cout << json{{"dtype", pf->dtype},
                          {"vae_dtype", pf->vae_dtype},
                          {"attention", pf->attention},
                          {"min_psnr_db", std::isfinite(worst) ? json(worst) : json("inf")},
                          {"cases", out}}
                         .dump(2)
                  << "\n";
      } else {
        for (const auto& r : rows)
          std::printf("%-28s PSNR %7.2f dB  max|diff| %.4f  vs golden %.2e\n", r.case_name.c_str(),
                      r.psnr_db, r.max_abs_diff, r.golden_max_abs_err);
        std::printf("min PSNR %.2f dB (%s, vae %s, attention %s vs float32 + math)\n", worst,
                    pf->dtype.c_str(), pf->vae_dtype.c_str(), pf->attention.c_str());
      }
      return 0;
    }
    if (att->parsed()) {
      bench::AttentionBenchOptions ao;
      ao.device = af->device;
      const auto device = device::resolve_device(af->device);
      ao.dtypes = dtypes_for(af->dtype, device);
      for (const auto& b : af->backends) ao.backends.push_back(nn::parse_attention_backend(b));
      ao.repeat = af->repeat;
      ao.max_memory_gb = af->max_memory_gb;
      if (!af->json) ao.log = [](const std::string& line) { std::cerr << line << "\n"; };
      auto rows = bench::run_attention_bench(bench::attention_cases(af->set), ao);
      if (af->json) {
        json out = json::array();
        for (const auto& r : rows)
          out.push_back({{"case", r.c.name},
                         {"batch", r.c.batch},
                         {"heads", r.c.heads},
                         {"nq", r.c.nq},
                         {"nk", r.c.nk},
                         {"head_dim", r.c.head_dim},
                         {"causal", r.c.causal},
                         {"dtype", r.dtype},
                         {"backend", r.backend},
                         {"kernel", r.kernel},
                         {"skipped", r.skipped},
                         {"note", r.note},
                         {"seconds", r.seconds},
                         {"gflops", r.gflops},
                         {"peak_extra_mb", r.peak_extra_mb}});
        std::cout << json{{"device", device::device_name(device)},
                          {"threads", at::get_num_threads()},
                          {"rows", out}}
                         .dump(2)
                  << "\n";
        return 0;
      }
      std::printf("%-34s %-5s %-6s %-12s %10s %10s %12s\n", "case", "dtype", "backend", "kernel",
                  "time [ms]", "GFLOP/s", "peak +MiB");
      for (const auto& r : rows) {
        if (r.skipped)
          std::printf("%-34s %-5s %-6s %-12s %10s   (%s)\n", r.c.name.c_str(), r.dtype.c_str(),
                      r.backend.c_str(), r.kernel.c_str(), "skipped", r.note.c_str());
        else
          std::printf("%-34s %-5s %-6s %-12s %10.2f %10.1f %12.1f\n", r.c.name.c_str(),
                      r.dtype.c_str(), r.backend.c_str(), r.kernel.c_str(), r.seconds * 1e3,
                      r.gflops, r.peak_extra_mb);
      }
      return 0;
    }
    if (roof->parsed()) {
      const auto device = device::resolve_device(rf->device);
      json all = json::array();
      for (auto dt : dtypes_for(rf->dtype, device)) {
        for (bool cl : {false, true}) {
          auto r = bench::measure_roofline(device, dt, cl);
          if (rf->json)
            all.push_back(roofline_json(r));
          else
            print_roofline(r);
        }
      }
      if (rf->json)
        std::cout << json{{"threads", at::get_num_threads()}, {"rooflines", all}}.dump(2) << "\n";
      return 0;
    }
    if (*fail_above && (models::is_dit_arch(o->arch) || bench::is_text_encoder_arch(o->arch)))
      throw InvalidArgument("--fail-above checks a UNet step: not with --arch " + o->arch);
    if (o->whole_image_steps > 0 && o->model.empty())
      throw InvalidArgument(
          "--whole-image runs the real pipeline: it needs a model folder (-m), e.g. one written by "
          "diffuse create-demo-model --arch sd2.1-base");
    if (models::is_flux_arch(o->arch) && batch->count() == 0) o->batch = 1;
    if (models::is_dit_arch(o->arch)) return run_dit_block_bench(*o, *as_json);
    if (bench::is_text_encoder_arch(o->arch)) return run_text_encoder_bench(*o, *as_json);
    return run_pipeline(*o, *as_json, *fail_above);
  };
}

}  // namespace diffuse::app
