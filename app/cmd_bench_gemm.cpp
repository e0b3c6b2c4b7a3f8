// `diffuse bench gemm`: the models' bf16 linear-layer shapes through our AVX512-BF16 kernel and
// through oneDNN side by side, and a whole text encoder under each (bench/gemm_bench.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/gemm_bench.h"
#include "commands.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_gemm(CLI::App& bench) {
  struct Flags {
    bench::GemmBenchOptions opts;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "gemm", "bf16 linear layers: our AVX512-BF16 kernel vs oneDNN on the models' shapes");
  sub->add_option("--arch", f->opts.arch, "Built-in architecture whose text encoder runs whole")
      ->capture_default_str();
  sub->add_option("--batch", f->opts.batch, "Prompts per text-encoder forward")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--min-seconds", f->opts.min_seconds, "Timing per shape and path")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f]() {
    auto opts = f->opts;
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_gemm_bench(opts);
    if (f->json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& x : r.rows)
        rows.push_back({{"model", x.model},
                        {"layer", x.layer},
                        {"m", x.m},
                        {"n", x.n},
                        {"k", x.k},
                        {"own_s", x.own_s},
                        {"onednn_s", x.onednn_s},
                        {"own_gflops", x.own_gflops},
                        {"onednn_gflops", x.onednn_gflops},
                        {"speedup", x.onednn_s / x.own_s},
                        {"diff_in_rounding", x.diff_in_rounding},
                        {"auto_takes_own", x.auto_takes_own}});
      std::cout << nlohmann::json{{"available", r.available},
                                  {"why_not", r.why_not},
                                  {"cpu", r.cpu},
                                  {"threads", r.threads},
                                  {"rows", rows},
                                  {"text_model", r.text_model},
                                  {"text_tokens", r.text_tokens},
                                  {"text_own_s", r.text_own_s},
                                  {"text_onednn_s", r.text_onednn_s},
                                  {"text_max_abs_diff", r.text_max_abs_diff},
                                  {"text_max_abs", r.text_max_abs}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::printf("%s, %d threads\n", r.cpu.c_str(), r.threads);
    if (!r.available) {
      std::printf("%s\n", r.why_not.c_str());
      return 0;
    }
    std::printf("%-26s %-28s %18s %8s %8s %8s %6s %5s\n", "model", "layer", "rows x out x in",
                "own", "oneDNN", "speed-up", "diff", "auto");
    std::printf("%-26s %-28s %18s %8s %8s %8s %6s %5s\n", "", "", "", "GFLOP/s", "GFLOP/s", "", "",
                "");
    for (const auto& x : r.rows) {
      const std::string dims =
          std::to_string(x.m) + "x" + std::to_string(x.n) + "x" + std::to_string(x.k);
      std::printf("%-26s %-28s %18s %8.1f %8.1f %7.2fx %6.2f %5s\n", x.model.c_str(),
                  x.layer.c_str(), dims.c_str(), x.own_gflops, x.onednn_gflops,
                  x.onednn_s / x.own_s, x.diff_in_rounding, x.auto_takes_own ? "own" : "oneDNN");
    }
    std::printf(
        "(diff: largest |own - oneDNN| in units of bf16 rounding plus float32 sum error; "
        "<= 2 agrees)\n");
    std::printf(
        "%s, %d prompts x %d tokens, bf16: own %.1f ms, oneDNN %.1f ms = %.2fx; last "
        "hidden state max |diff| %.3g (max |value| %.3g)\n",
        r.text_model.c_str(), f->opts.batch, r.text_tokens, r.text_own_s * 1e3,
        r.text_onednn_s * 1e3, r.text_onednn_s / r.text_own_s, r.text_max_abs_diff, r.text_max_abs);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
