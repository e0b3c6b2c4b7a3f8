// `diffuse bench --arch hidream-i1 | flux-dev | flux-schnell | qwen-image`: a real DiT
// configuration (HiDream-I1: 16 dual-stream + 32 single-stream blocks, 20 heads x 128, 4 routed
// experts top-2 + shared, 17B; FLUX.1: 19 double- + 38 single-stream blocks, 24 heads x 128, 12B;
// Qwen-Image: 60 double-stream blocks, 24 heads x 128, 20B) is too
// large to build whole on a small machine, so the bench builds ONE block of each kind at full
// width with random weights, runs it at the pipeline's token counts (1024x1024 -> 4096 image
// tokens; HiDream 128 T5 + 128 + 128 Llama tokens, FLUX 512 T5 tokens, schnell 256), counts
// its FLOPs, compares its time with this run's matmul roofline and extrapolates a full
// denoising step.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/flop_counter.h"
#include "bench/roofline.h"

namespace diffuse::bench {

struct DitBlockBenchOptions {
  std::string arch = "hidream-i1";  // or flux-dev, flux-schnell, qwen-image
  std::string device = "auto", dtype = "auto", attention = "auto";
  int width = 1024, height = 1024;
  int batch = 2;        // HiDream: 2 = one image with classifier-free guidance; FLUX: 1 image
  int text_tokens = 0;  // 0: the pipeline's (HiDream 128 per encoder, FLUX 512, schnell 256)
  int repeat = 2;       // timed runs per block after one warm-up
  bool roofline = true;
  // "q8_0"/"q4_0": each block is timed again with its linear weights kept quantized
  // (nn::quantize_linear_layers), on the same inputs, in the same run.
  std::string weights = "none";
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;
};

struct BlockTiming {
  double params_m = 0;  // parameters, millions
  double best_s = 0, mean_s = 0;
  FlopCounts flops;              // one run
  double peak_mb = 0;            // peak RSS while it ran (0 where it cannot be reset)
  double device_peak_mb = 0;     // accelerator memory its tensors held at the peak (0 on cpu)
  double roofline_fraction = 0;  // (flops / matmul roofline) / best_s
};

// A block timed with quantized linear weights, against the same block's plain run.
struct QuantizedBlockTiming {
  BlockTiming timing;
  double plain_mb = 0, quantized_mb = 0;  // the quantized layers' weights, before and after
  double block_plain_mb = 0, block_quantized_mb = 0;  // the whole block's weights
  double relative_error = 0;  // ||y_q - y|| / ||y|| of the block's image output
  // Dequantizing every quantized layer of the block once (what each forward adds to the same
  // products), best of the runs: steadier than the difference of two noisy block times.
  double dequantize_s = 0;
  // int8 on a CPU with VNNI: the layers multiply in 8-bit integers and dequantize nothing.
  bool integer_products = false;
};

struct DitBlockBenchResult {
  std::string arch, device, dtype, attention;
  int width = 0, height = 0, batch = 0, image_tokens = 0, text_tokens = 0, threads = 0;
  int num_layers = 0, num_single_layers = 0;
  BlockTiming dual, single;
  double step_estimate_s = 0;       // num_layers * dual + num_single_layers * single
  double transformer_params_b = 0;  // the whole transformer, billions
  double transformer_gib = 0;       // its weights in `dtype`
  std::string weights = "none";
  std::optional<QuantizedBlockTiming> dual_quantized, single_quantized;
  double step_estimate_quantized_s = 0;
  double transformer_quantized_gib = 0;  // blocks quantized as measured, the rest plain
  std::optional<Roofline> roofline;
};

// InvalidArgument for an unknown arch or sizes the model cannot take.
DitBlockBenchResult run_dit_block_bench(const DitBlockBenchOptions& options);
nlohmann::json to_json(const DitBlockBenchResult& r);

}  // namespace diffuse::bench
