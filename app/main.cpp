#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <iostream>

#include "commands.h"
#include "device/cpu_reproducibility.h"
#include "diffuse/errors.h"
#include "interrupt.h"
#include "startup_env.h"

int main(int argc, char** argv) {
  diffuse::app::restart_with_startup_settings(argv);
  // Every command, verify and the benchmarks included, before anything runs on the CPU.
  diffuse::device::request_reproducible_blas();
  CLI::App app{"diffuse: diffusion image models on CPU, CUDA and Ascend NPU"};
  app.require_subcommand(1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  std::vector<std::pair<CLI::App*, diffuse::app::Command>> commands;
  auto add = [&](const char* name, const char* help, auto factory) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, factory(*sub));
  };
  add("txt2img", "Generate images from a prompt", diffuse::app::add_txt2img_command);
  add("img2img", "Transform an image guided by a prompt", diffuse::app::add_img2img_command);
  add("edit", "Edit an image from an instruction (HiDream-E1)", diffuse::app::add_edit_command);
  add("serve", "Serve the web page and the HTTP APIs (native, AUTOMATIC1111, OpenAI) for one model",
      diffuse::app::add_serve_command);
  add("train-demo", "Train the demo model (shapes world) from scratch",
      diffuse::app::add_train_demo_command);
  add("create-demo-model", "Write a full-size random-weight model (for benchmarks)",
      diffuse::app::add_create_demo_command);
  add("quantize", "Write a model's weights as a GGUF file (q8_0, q4_0, f16, ...)",
      diffuse::app::add_quantize_command);
  add("export", "Write a model component for other runtimes (export onnx: ONNX for ATC/OM)",
      diffuse::app::add_export_command);
  add("verify", "Compare the engine with a golden reference set", diffuse::app::add_verify_command);
  add("doctor", "Check libtorch, BLAS, CPU features and every device",
      diffuse::app::add_doctor_command);
  add("bench", "Benchmark pipeline stages, attention backends (bench attention) or the roofline",
      diffuse::app::add_bench_command);

  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::cout << "diffuse " << DIFFUSE_VERSION << " (libtorch " << TORCH_VERSION << ")\n";
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // One line, like every other error.
    std::cerr << "error: " << e.what() << " (see --help)\n";
    return 2;  // a usage error, as getopt-style tools report it
  }
  diffuse::app::install_interrupt_handlers();
  try {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const diffuse::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
