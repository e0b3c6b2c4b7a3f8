#include <iostream>

#include "commands.h"
#include "pipeline/memory_plan.h"
#include "pipeline/real_size_model.h"

namespace diffuse::app {

Command add_create_demo_command(CLI::App& app) {
  struct Opts {
    std::string out;
    uint64_t seed = pipeline::RandomFolderOptions().seed;
    std::string arch;
    std::string weights;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-o,--out", o->out, "Folder to write the model into (new, or empty)")->required();
  app.add_option("--seed", o->seed, "Seed of the random weights")->capture_default_str();
  app.add_option("--arch", o->arch,
                 "Architecture at its real configuration, random weights, for measuring loading "
                 "and whole runs: sd1.5|sd2.1-base|sd2.1|sdxl (or tiny, a small UNet), "
                 "flux-dev|flux-schnell|flux-kontext (12B + T5-XXL, ~34 GB in bf16) or "
                 "hidream-i1|hidream-e1 (17B + Llama-3.1-8B + T5-XXL + CLIP-L/G, ~61 GB). The "
                 "trained demo model is made by `diffuse train-demo`")
      ->required();
  app.add_option("--weights", o->weights,
                 "bf16 or fp16 as the real repositories ship (default: fp16 for Stable Diffusion, "
                 "bf16 for the DiTs), or q8_0 (the UNet or transformer as a GGUF of q8_0 "
                 "blocks: about half its bytes)");
  return [o]() {
    const auto spec = pipeline::real_size_spec(o->arch);
    pipeline::RandomFolderOptions options;
    options.seed = o->seed;
    options.weights = o->weights;
    options.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto report = pipeline::write_random_folder(o->out, spec, options);
    std::cout << "wrote a " << o->arch << " folder (random weights, "
              << pipeline::format_memory(report.bytes) << ") to " << o->out << "\n";
    return 0;
  };
}

}  // namespace diffuse::app
