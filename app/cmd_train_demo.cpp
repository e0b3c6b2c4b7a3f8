// `diffuse train-demo`: trains the demo model (train/demo_trainer.h) with a progress line per
// stage. Ctrl-C stops at the next step and leaves nothing behind.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>

#include "commands.h"
#include "diffuse/errors.h"
#include "flag_checks.h"
#include "progress.h"
#include "train/demo_trainer.h"

namespace diffuse::app {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};

extern "C" void on_interrupt(int signal) {
  g_signal.store(signal);
  g_interrupted.store(true);
}

class TrainPrinter {
 public:
  explicit TrainPrinter(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO)) {}
  void operator()(const train::TrainProgress& p) {
    if (quiet_) return;
    const bool last = p.step == p.total;
    if (p.stage != stage_) {
      if (tty_ && !stage_.empty()) std::fputc('\n', stderr);
      stage_ = p.stage;
    }
    // On a terminal the line is redrawn; in a log, one line per 2 % of the stage.
    const int64_t every = std::max<int64_t>(1, p.total / 50);
    if (!tty_ && !last && p.step % every != 0) return;
    char line[256];
    if (p.stage == "encode")
      std::snprintf(line, sizeof line, "[encode] %lld/%lld scenes  %s elapsed  ETA %s",
                    static_cast<long long>(p.step), static_cast<long long>(p.total),
                    format_seconds(p.stage_elapsed_s).c_str(), format_seconds(p.eta_s).c_str());
    else
      std::snprintf(line, sizeof line, "[%s] step %lld/%lld  loss %.4f  %s elapsed  ETA %s",
                    p.stage.c_str(), static_cast<long long>(p.step),
                    static_cast<long long>(p.total), p.loss,
                    format_seconds(p.stage_elapsed_s).c_str(), format_seconds(p.eta_s).c_str());
    if (tty_)
      std::fprintf(stderr, "\r\033[K%s%s", line, last ? "\n" : "");
    else
      std::fprintf(stderr, "%s\n", line);
    if (last) stage_.clear();
  }

 private:
  bool quiet_, tty_;
  std::string stage_;
};

}  // namespace

Command add_train_demo_command(CLI::App& app) {
  struct Opts {
    train::TrainDemoOptions train;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  auto& t = o->train;
  app.add_option("-o,--out", t.out, "Folder to write the trained model into")->required();
  app.add_option("--arch", t.arch,
                 "sd (Stable Diffusion architecture: txt2img/img2img) or hidream-e1 (HiDream "
                 "architecture: txt2img and instruction editing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sd", "hidream-e1"}));
  app.add_flag("--force", t.force, "Replace the folder if it exists and is not empty");
  app.add_option("--minutes", t.minutes,
                 "Time budget of the whole run; the step counts follow from it unless given")
      ->capture_default_str();
  app.add_option("--seed", t.seed, "Seed of weights, scenes and noise")
      ->capture_default_str()
      ->check(int_range(0, std::numeric_limits<int64_t>::max(), "a seed"));
  app.add_option("--vae-steps", t.vae_steps, "Autoencoder steps (0 = 30 % of the time budget)")
      ->capture_default_str();
  app.add_option("--unet-steps", t.unet_steps,
                 "Denoiser (UNet or transformer) steps (0 = the rest of the time budget)")
      ->capture_default_str();
  app.add_option("--resolution", t.resolution, "Training image size")->capture_default_str();
  app.add_option("--vae-batch", t.vae_batch, "Images per autoencoder step")->capture_default_str();
  app.add_option("--vae-crop", t.vae_crop, "Autoencoder training crop size")->capture_default_str();
  app.add_option("--unet-batch", t.unet_batch, "Latents per denoiser step")->capture_default_str();
  app.add_option("--dataset", t.dataset_size,
                 "Scenes (hidream-e1: edit pairs) encoded for the denoiser stage")
      ->capture_default_str();
  app.add_option("--precision", t.precision,
                 "auto|fp32|bf16 (auto: bf16 autocast where the CPU has native bf16)")
      ->capture_default_str();
  app.add_option("--learning-rate", t.learning_rate,
                 "Peak learning rate of the denoiser stage (0 = the architecture's default; "
                 "lower it to continue a trained model with --init-from)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--init-from", t.init_from,
                 "Continue from the folder of an earlier --arch hidream-e1 run (its weights, "
                 "tokenizers and autoencoder)");
  app.add_option("--edit-mix", t.edit_mix,
                 "hidream-e1: how often each edit kind is trained, 'natural' (each scene takes "
                 "a kind that applies to it) or KIND=WEIGHT,... over background, recolour, "
                 "move, reshape, remove, add (unnamed kinds weigh 1)")
      ->capture_default_str();
  app.add_flag("-q,--quiet", o->quiet, "No progress output");
  return [o]() {
    g_interrupted.store(false);
    g_signal.store(0);
    auto previous_int = std::signal(SIGINT, on_interrupt);
    auto previous_term = std::signal(SIGTERM, on_interrupt);
    TrainPrinter printer(o->quiet);
    train::TrainReport report;
    try {
      report = train::train_demo(o->train, std::ref(printer), &g_interrupted);
    } catch (const Cancelled& e) {
      std::signal(SIGINT, previous_int);
      std::signal(SIGTERM, previous_term);
      if (g_signal.load() == 0) throw;
      // As every other command: 128 + the signal, the code shells report for it.
      std::cerr << "interrupted: " << e.what() << "\n";
      return 128 + g_signal.load();
    } catch (...) {
      std::signal(SIGINT, previous_int);
      std::signal(SIGTERM, previous_term);
      throw;
    }
    std::signal(SIGINT, previous_int);
    std::signal(SIGTERM, previous_term);
    std::cout << "wrote the trained demo model to " << o->train.out << " (" << report.parameters
              << " parameters; autoencoder " << report.vae_steps << " steps, "
              << (o->train.arch == "sd" ? "UNet " : "transformer ") << report.unet_steps
              << " steps; " << format_seconds(report.total_s) << ")\n"
              << "to repeat this run exactly: see " << o->train.out << "/training.json\n";
    return 0;
  };
}

}  // namespace diffuse::app
