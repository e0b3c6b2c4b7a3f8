#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "quant/quantized_weight.h"
#include "verify/verify.h"

namespace diffuse::app {

Command add_verify_command(CLI::App& app) {
  struct Opts {
    std::string golden;
    std::vector<std::string> components;
    std::string device = "cpu";
    std::string weights = "none";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("golden,--golden", o->golden, "Golden set folder (with cases.json)")->required();
  app.add_option("--component", o->components, "Only cases of this component (repeatable)");
  app.add_option("--device", o->device, "Device to run on");
  app.add_option(
         "--weights", o->weights,
         "none|q8_0|q4_0|int8: run only the denoiser cases (unet, transformer) with their linear "
         "weights quantized, each output within a relative RMS error of 5% (q8_0) / 60% (q4_0)")
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() {
    auto set = verify::GoldenSet::load(o->golden);
    verify::VerifyOptions options;
    options.device =
        device::resolve_device(o->device);  // also npu[:N], which torch::Device cannot parse
    options.components = o->components;
    options.weights = quant::parse_weight_type(o->weights, "--weights");
    auto results = verify::run_all(set, options);
    if (results.empty() && options.weights)
      throw InvalidArgument("--weights " + o->weights + ": " + o->golden +
                            " has no unet or transformer case to run with quantized weights");
    if (results.empty()) {  // "0 passed, 0 failed" would read as a success
      std::string wanted, present;
      for (const auto& c : o->components) wanted += (wanted.empty() ? "" : ", ") + c;
      for (const auto& c : set.cases)
        if (present.find("'" + c.component + "'") == std::string::npos)
          present += (present.empty() ? "'" : ", '") + c.component + "'";
      throw InvalidArgument("--component " + wanted + ": no case in " + o->golden +
                            "/cases.json has that component (expected one of " + present + ")");
    }
    int passed = 0, failed = 0;
    nlohmann::json cases = nlohmann::json::array();
    for (const auto& r : results) {
      (r.passed ? passed : failed)++;
      cases.push_back({{"name", r.name},
                       {"component", r.component},
                       {"passed", r.passed},
                       {"max_abs_err", std::isfinite(r.max_abs_err) ? nlohmann::json(r.max_abs_err)
                                                                    : nlohmann::json(nullptr)},
                       {"reason", r.reason}});
      if (!o->json) {
        std::cout << std::left << std::setw(30) << r.name << std::setw(14) << r.component
                  << " max_abs_err=" << std::setw(12) << r.max_abs_err
                  << (r.passed ? " PASS" : " FAIL");
        if (!r.passed) std::cout << "  (" << r.reason << ")";
        // Quantized weights: the output's relative RMS error, what the tolerance bounds.
        if (r.passed && options.weights && !r.details.empty()) {
          const auto& d = r.details.front();
          const auto open = d.find('['), close = d.rfind(']');
          if (open != std::string::npos && close > open)
            std::cout << "  " << d.substr(open + 1, close - open - 1);
        }
        std::cout << "\n";
      }
    }
    if (o->json) {
      std::cout << nlohmann::json{{"cases", cases}, {"passed", passed}, {"failed", failed}}.dump(2)
                << "\n";
    } else {
      std::cout << passed << " passed, " << failed << " failed\n";
    }
    return failed == 0 ? 0 : 1;
  };
}

}  // namespace diffuse::app
