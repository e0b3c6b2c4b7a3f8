// `diffuse bench lora`: apply/remove times of a rank-16 adapter on a real-size model and the
// UNet step plain vs merged vs unmerged (bench/lora_bench.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/lora_bench.h"
#include "commands.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_lora(CLI::App& bench) {
  struct Flags {
    bench::LoraBenchOptions opts;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "lora", "LoRA apply/remove time and step cost (merged vs unmerged) on a real-size model");
  sub->add_option("--arch", f->opts.arch, "Built-in architecture")->capture_default_str();
  sub->add_option("--rank", f->opts.rank, "Adapter rank")->capture_default_str();
  sub->add_option("-W,--width", f->opts.width, "Width in pixels")->capture_default_str();
  sub->add_option("-H,--height", f->opts.height, "Height in pixels")->capture_default_str();
  sub->add_option("--batch", f->opts.batch, "UNet batch (2 = CFG)")->capture_default_str();
  sub->add_option("--repeats", f->opts.repeats, "Timed steps per setting")->capture_default_str();
  sub->add_option("--dtype", f->opts.dtype, "auto|fp32|bf16|fp16")->capture_default_str();
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f]() {
    auto opts = f->opts;
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_lora_bench(opts);
    const double merged = r.step_merged_s / r.step_plain_s;
    const double unmerged = r.step_unmerged_s / r.step_plain_s;
    if (f->json) {
      std::cout << nlohmann::json{{"arch", r.arch},
                                  {"dtype", r.dtype},
                                  {"rank", r.rank},
                                  {"pairs", r.pairs},
                                  {"adapter_params_m", r.adapter_params_m},
                                  {"read_s", r.read_s},
                                  {"merged_apply_s", r.apply_s},
                                  {"merged_rescale_s", r.rescale_s},
                                  {"merged_remove_s", r.remove_s},
                                  {"restored_bit_identical", r.restored_bit_identical},
                                  {"unmerged_attach_s", r.attach_s},
                                  {"unmerged_detach_s", r.detach_s},
                                  {"step_plain_s", r.step_plain_s},
                                  {"step_merged_s", r.step_merged_s},
                                  {"step_unmerged_s", r.step_unmerged_s},
                                  {"merged_vs_plain", merged},
                                  {"unmerged_vs_plain", unmerged}}
                       .dump(2)
                << "\n";
    } else {
      std::printf("%s (%s), adapter: %d pairs, rank %d, %.1fM parameters (checked in %.2f s)\n",
                  r.arch.c_str(), r.dtype.c_str(), r.pairs, r.rank, r.adapter_params_m, r.read_s);
      std::printf("merged:   apply %.3f s, rescale %.3f s, remove %.3f s (restore %s)\n", r.apply_s,
                  r.rescale_s, r.remove_s,
                  r.restored_bit_identical ? "bit-identical" : "NOT bit-identical");
      std::printf("unmerged: attach %.4f s, detach %.4f s\n", r.attach_s, r.detach_s);
      std::printf(
          "UNet step %dx%d batch %d: plain %.2f s, merged %.2f s (%.3fx), unmerged %.2f s "
          "(%.3fx)\n",
          f->opts.width, f->opts.height, f->opts.batch, r.step_plain_s, r.step_merged_s, merged,
          r.step_unmerged_s, unmerged);
    }
    return r.restored_bit_identical ? 0 : 1;
  };
  return {sub, run};
}

}  // namespace diffuse::app
