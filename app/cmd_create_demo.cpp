#include <iostream>

#include "commands.h"
#include "pipeline/demo_model.h"
#include "pipeline/hidream_random_model.h"

namespace diffuse::app {

Command add_create_demo_command(CLI::App& app) {
  struct Opts {
    std::string out;
    uint64_t seed = pipeline::DemoModelOptions().seed;
    std::string arch;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-o,--out", o->out, "Folder to write the demo model into")->required();
  app.add_option("--seed", o->seed, "Seed of the random weights")->capture_default_str();
  app.add_option("--arch", o->arch,
                 "Architecture: sd2.1-base|sd2.1|sd1.5 (real configs, random F16 weights, "
                 "~2.6 GB; for measuring loading and whole runs), or hidream-i1 (its 17B "
                 "transformer only, random bf16, ~34 GB; for bench hidream-stream)")
      ->required();
  return [o]() {
    if (o->arch == "hidream-i1") {
      pipeline::RandomHiDreamOptions options;
      options.seed = o->seed;
      options.log = [](const std::string& line) { std::cerr << line << "\n"; };
      pipeline::create_random_hidream_i1(o->out, options);
      std::cout << "wrote hidream-i1 transformer (random weights) to " << o->out << "\n";
      return 0;
    }
    pipeline::DemoModelOptions options;
    options.seed = o->seed;
    options.arch = o->arch;
    pipeline::create_demo_model(o->out, options);
    std::cout << "wrote " + o->arch + " model (random weights) to " << o->out << "\n";
    return 0;
  };
}

}  // namespace diffuse::app
