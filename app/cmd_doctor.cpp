// `diffuse doctor`: checks the environment and every device; exit 1 when the requested device
// (--device, default auto: what txt2img would pick) cannot run.
#include <torch/torch.h>

#include <iostream>

#include "commands.h"
#include "device/doctor.h"

namespace diffuse::app {

Command add_doctor_command(CLI::App& app) {
  struct Opts {
    std::string device = "auto";
    bool json = false;
    bool no_smoke = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--device", o->device,
                 "Device that must be able to run: auto|cpu|cuda[:N]|npu[:N]")
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print one JSON object (for scripts)");
  app.add_flag("--no-smoke-test", o->no_smoke, "Skip the block forward on each device");
  return [o]() {
    device::DoctorOptions options;
    options.device = o->device;
    options.smoke_test = !o->no_smoke;
    auto report = device::run_doctor(options);
    if (o->json)
      std::cout << device::to_json(report).dump(2) << "\n";
    else
      std::cout << device::to_text(report);
    return report.requested_ok ? 0 : 1;
  };
}

}  // namespace diffuse::app
