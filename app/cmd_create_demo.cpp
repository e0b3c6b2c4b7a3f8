#include <iostream>

#include "commands.h"
#include "diffuse/errors.h"
#include "pipeline/demo_model.h"
#include "pipeline/memory_plan.h"
#include "pipeline/real_size_model.h"

namespace diffuse::app {

Command add_create_demo_command(CLI::App& app) {
  struct Opts {
    std::string out;
    uint64_t seed = pipeline::DemoModelOptions().seed;
    std::string arch;
    std::string weights;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-o,--out", o->out, "Folder to write the demo model into")->required();
  app.add_option("--seed", o->seed, "Seed of the random weights")->capture_default_str();
  app.add_option("--arch", o->arch,
                 "Architecture: sd2.1-base|sd2.1|sd1.5|sdxl (real configs, random F16 weights; "
                 "for measuring loading and whole runs), or a complete real-size DiT folder: "
                 "flux-dev|flux-schnell|flux-kontext (12B + T5-XXL, ~34 GB in bf16) or "
                 "hidream-i1|hidream-e1 (17B + Llama-3.1-8B + T5-XXL + CLIP-L/G, ~61 GB)")
      ->required();
  app.add_option("--weights", o->weights,
                 "DiT folders: bf16 (default) or fp16 as the real repositories ship, or q8_0 "
                 "(the transformer as a GGUF of q8_0 blocks: about half its bytes)");
  return [o]() {
    if (pipeline::is_real_size_dit_arch(o->arch)) {
      pipeline::RandomFolderOptions options;
      options.seed = o->seed;
      if (!o->weights.empty()) options.weights = o->weights;
      options.log = [](const std::string& line) { std::cerr << line << "\n"; };
      const auto report =
          pipeline::write_random_dit_folder(o->out, pipeline::real_size_dit_spec(o->arch), options);
      std::cout << "wrote a " << o->arch << " folder (random weights, "
                << pipeline::format_memory(report.bytes) << ") to " << o->out << "\n";
      return 0;
    }
    if (!o->weights.empty())
      throw InvalidArgument("create-demo-model --weights is for the DiT architectures (" + o->arch +
                            " is written in F16)");
    pipeline::DemoModelOptions options;
    options.seed = o->seed;
    options.arch = o->arch;
    pipeline::create_demo_model(o->out, options);
    std::cout << "wrote " + o->arch + " model (random weights) to " << o->out << "\n";
    return 0;
  };
}

}  // namespace diffuse::app
