// `diffuse doctor`: checks the environment and every device; exit 1 when the requested device
// (--device, default auto: what txt2img would pick) cannot run. With -m, the memory plan of that
// model folder on each device that works, from its configs alone (no weight is read).
#include <torch/torch.h>

#include <iostream>

#include "commands.h"
#include "device/device.h"
#include "device/doctor.h"
#include "io/model_folder.h"
#include "memory_flags.h"
#include "pipeline/memory_plan_folder.h"

namespace diffuse::app {
namespace {

struct Opts {
  std::string device = "auto";
  bool json = false;
  bool no_smoke = false;
  std::string model, weights = "none", stream_weights = "auto", max_memory;
  int width = 0, height = 0;
};

// The plan of o.model on each working device of the report.
nlohmann::json model_plans(const Opts& o, const device::DoctorReport& report) {
  const auto folder = io::ModelFolder::open(o.model);
  const std::string family = pipeline::plan_family(folder);
  nlohmann::json plans = nlohmann::json::array();
  for (const auto& d : report.devices) {
    if (!d.error.empty()) continue;
    const auto dev = device::resolve_device(d.name);
    pipeline::FolderPlanOptions po;
    po.device = dev;
    po.dtype = device::resolve_dtype("auto", dev, "unet");
    po.vae_dtype = device::resolve_dtype("auto", dev, "vae");
    po.width = o.width;
    po.height = o.height;
    po.streaming = o.stream_weights;
    po.weight_type = o.weights;
    po.max_memory = max_memory_bytes(o.max_memory);
    const auto plan = pipeline::plan_folder(folder, po);
    nlohmann::json stages = nlohmann::json::object();
    for (const auto& s : plan.peaks) stages[s.stage] = s.bytes;
    plans.push_back({{"device", d.name},
                     {"family", family},
                     {"fits", plan.fits},
                     {"line", plan.line},
                     {"advice", plan.advice},
                     {"peak_bytes", plan.peak},
                     {"budget_bytes", plan.budget},
                     {"stage_peak_bytes", stages}});
  }
  return plans;
}

}  // namespace

Command add_doctor_command(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.add_option("--device", o->device,
                 "Device that must be able to run: auto|cpu|cuda[:N]|npu[:N]")
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print one JSON object (for scripts)");
  app.add_flag("--no-smoke-test", o->no_smoke, "Skip the block forward on each device");
  app.add_option("-m,--model", o->model,
                 "A diffusers folder: print its memory plan on each device (nothing loads)");
  app.add_option("-W,--width", o->width, "Width the plan is for (default: the family's size)");
  app.add_option("-H,--height", o->height, "Height the plan is for (default: the family's size)");
  app.add_option("--weights", o->weights, "Plan with the denoiser quantized: none|q8_0|q4_0|int8")
      ->capture_default_str();
  app.add_option("--stream-weights", o->stream_weights, "auto|on|off, as for txt2img")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_max_memory_flag(app, o->max_memory);
  return [o]() {
    device::DoctorOptions options;
    options.device = o->device;
    options.smoke_test = !o->no_smoke;
    auto report = device::run_doctor(options);
    nlohmann::json plans;
    if (!o->model.empty()) plans = model_plans(*o, report);
    if (o->json) {
      auto j = device::to_json(report);
      if (!o->model.empty()) j["model_plans"] = plans;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << device::to_text(report);
      for (const auto& p : plans) {
        std::cout << "model plan on " << p["device"].get<std::string>() << ": "
                  << p["line"].get<std::string>() << "\n";
        if (!p["fits"].get<bool>())
          std::cout << "  does not fit: " << p["advice"].get<std::string>() << "\n";
      }
    }
    bool fits = true;
    for (const auto& p : plans) fits = fits && p["fits"].get<bool>();
    return report.requested_ok && fits ? 0 : 1;
  };
}

}  // namespace diffuse::app
