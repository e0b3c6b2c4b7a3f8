// `diffuse bench hidream-stream`: a full-size HiDream transformer step from disk, streamed or
// resident (bench/hidream_stream_bench.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/hidream_stream_bench.h"
#include "commands.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_hidream_stream(CLI::App& bench) {
  struct Flags {
    bench::HiDreamStreamBenchOptions opts;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "hidream-stream", "One full-size HiDream transformer step from disk, streamed or resident");
  sub->add_option("-m,--model", f->opts.model,
                  "Folder with transformer/ (diffuse create-demo-model --arch hidream-i1)")
      ->required();
  sub->add_option("--device", f->opts.device, "Device")->capture_default_str();
  sub->add_option("--dtype", f->opts.dtype, "auto|fp32|bf16|fp16")->capture_default_str();
  sub->add_option("--stream-weights", f->opts.stream, "auto|on|off")->capture_default_str();
  sub->add_option("-W,--width", f->opts.width, "Width in pixels")->capture_default_str();
  sub->add_option("-H,--height", f->opts.height, "Height in pixels")->capture_default_str();
  sub->add_option("--batch", f->opts.batch, "Batch (2 = CFG)")->capture_default_str();
  sub->add_option("--text-tokens", f->opts.text_tokens, "T5 and Llama tokens each")
      ->capture_default_str();
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f]() {
    auto opts = f->opts;
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_hidream_stream_bench(opts);
    const nlohmann::json j = {{"device", r.device},
                              {"dtype", r.dtype},
                              {"streamed", r.streamed},
                              {"zero_copy", r.zero_copy},
                              {"weights_gib", r.weights_gib},
                              {"streamed_gib", r.streamed_gib},
                              {"available_gib", r.available_gib},
                              {"image_tokens", r.image_tokens},
                              {"load_s", r.load_s},
                              {"load_peak_rss_gib", r.load_peak_rss_gib},
                              {"step_s", r.step_s},
                              {"step_peak_rss_gib", r.step_peak_rss_gib}};
    if (f->json) {
      std::cout << j.dump(2) << "\n";
    } else {
      std::printf("%s %s, weights %.1f GiB (%s), %.1f GiB available\n", r.device.c_str(),
                  r.dtype.c_str(), r.weights_gib,
                  r.streamed ? (r.zero_copy ? "streamed, zero-copy" : "streamed, copied per block")
                             : "resident",
                  r.available_gib);
      std::printf("load %.1f s (peak RSS %.2f GiB); one step %.1f s (peak RSS %.2f GiB)\n",
                  r.load_s, r.load_peak_rss_gib, r.step_s, r.step_peak_rss_gib);
    }
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
