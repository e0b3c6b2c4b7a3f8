// `diffuse serve`: loads the model once and serves the web page and the HTTP APIs until
// SIGINT/SIGTERM. With --devices (local ranks) or --parallel (a rank started elsewhere, by the
// torchrun convention) the model is loaded once per rank: rank 0 serves and hands each job to
// the others, and all run it together (src/server/rank_jobs.h).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "commands.h"
#include "flag_checks.h"
#include "load_flags.h"
#include "parallel/cfg_launch.h"
#include "parallel/worker_processes.h"
#include "parallel_flags.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/qwenimage.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/rank_jobs.h"
#include "server/server_state.h"

namespace diffuse::app {
namespace {

struct ServeFlags {
  std::string model;
  LoadFlags load;
  server::HiDreamEngineOptions hidream;
  server::ServerOptions options;
  double max_body_mb = 50;
  std::string shutdown = "cancel";
  bool quiet = false;
  ParallelFlags parallel;
};

// SIGINT/SIGTERM go through a pipe to a thread of their own: the handler only writes the
// signal number (async-signal-safe), since stopping the server is not. Blocking the signals
// and sigwait-ing would not do: threads that libraries start before main() runs keep them
// unblocked, and a signal delivered there would end the process. The first signal stops
// accepting and cancels (or lets finish) the running job; a second one cancels it in any case.
int g_signal_pipe_write = -1;

extern "C" void diffuse_serve_forward_signal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  const ssize_t written = ::write(g_signal_pipe_write, &byte, 1);
  (void)written;
}

class SignalWatcher {
 public:
  SignalWatcher() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) throw Error("cannot create the signal pipe");
    g_signal_pipe_write = fds_[1];
    struct sigaction action {};
    action.sa_handler = diffuse_serve_forward_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &action, &previous_[0]);
    ::sigaction(SIGTERM, &action, &previous_[1]);
  }
  // Stops the server as a SIGTERM would (from any thread; the stop itself runs on the watcher's).
  void stop() const {
    const unsigned char sig = SIGTERM;
    const ssize_t written = ::write(fds_[1], &sig, 1);
    (void)written;
  }
  void watch(server::HttpServer& http, bool cancel_running, bool quiet) {
    thread_ = std::thread([this, &http, cancel_running, quiet] {
      int signals = 0;
      std::thread stopper;
      for (;;) {
        unsigned char sig = 0;
        const ssize_t n = ::read(fds_[0], &sig, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1 || sig == 0) break;  // 0: our own wake-up at exit
        ++signals;
        if (signals == 1) {
          if (!quiet)
            std::cerr << "diffuse serve: shutting down ("
                      << (cancel_running ? "cancelling" : "finishing")
                      << " the running job; signal again to cancel it)\n";
          stopper = std::thread([&http, cancel_running] { http.stop(cancel_running); });
        } else if (auto job = http.state().queue.current_or_last()) {
          http.state().queue.cancel(job->id);
        }
      }
      if (stopper.joinable()) stopper.join();
    });
  }
  ~SignalWatcher() {
    ::sigaction(SIGINT, &previous_[0], nullptr);
    ::sigaction(SIGTERM, &previous_[1], nullptr);
    if (thread_.joinable()) {
      const unsigned char stop = 0;
      const ssize_t written = ::write(fds_[1], &stop, 1);
      (void)written;
      thread_.join();
    }
    g_signal_pipe_write = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction previous_[2]{};
  std::thread thread_;
};

// The parallel modes against the model's family, before anything loads: Stable Diffusion splits
// its two guidance branches, HiDream its branches (E1's three) and/or tokens, FLUX its tokens.
void check_serve_parallel(const ServeFlags& f) {
  const auto mode = parallel_mode(f.parallel);
  const int world = f.parallel.world;
  const std::string flag = "--parallel " + (f.parallel.mode.empty() ? "cfg" : f.parallel.mode);
  if (pipeline::is_qwenimage_folder(f.model)) {
    if (mode == ParallelMode::kCfgUlysses || (mode == ParallelMode::kCfg && world != 2))
      throw InvalidArgument(flag +
                            ": Qwen-Image runs --parallel cfg on 2 ranks (one true-CFG branch "
                            "each) or --parallel ulysses");
  } else if (pipeline::is_flux_folder(f.model)) {
    if (mode != ParallelMode::kUlysses)
      throw InvalidArgument(flag +
                            ": FLUX's guidance is one embedding; FLUX shares its work over "
                            "ranks with --parallel ulysses");
  } else if (pipeline::is_hidream_folder(f.model)) {
    if (mode == ParallelMode::kCfg && world > 3)
      throw InvalidArgument(flag + ": " + std::to_string(world) +
                            " ranks for HiDream's guidance branches (two, three in an edit: at "
                            "most three ranks; cfg,ulysses or ulysses use more)");
    if (mode == ParallelMode::kCfgUlysses && world % 2 != 0)
      throw InvalidArgument(flag + " runs on 2 x N ranks, not " + std::to_string(world));
  } else {
    if (mode != ParallelMode::kCfg)
      throw InvalidArgument(flag +
                            ": splits the image tokens of a DiT's attention (HiDream, FLUX); a "
                            "Stable Diffusion UNet runs --parallel cfg");
    if (world > 2)
      throw InvalidArgument("--parallel cfg: " + std::to_string(world) +
                            " ranks for Stable Diffusion's two guidance branches (at most two)");
  }
}

// What every rank of a parallel server must have been started with.
std::string serve_parallel_job(const ServeFlags& f) {
  return "model=" + f.model +
         "\ncommand=serve\nparallel=" + (f.parallel.mode.empty() ? "cfg" : f.parallel.mode) +
         "\ntransformer=" + f.hidream.transformer + "\nweights=" + f.load.weights +
         "\ndtype=" + f.load.dtype + "\n";
}

// The local launcher of `serve --devices`: the ranks run until rank 0's server stops; a Ctrl-C
// stops them all (rank 0 finishing as a signalled server does).
int launch_serve_ranks(const ServeFlags& f) {
  parallel::CfgLaunch launch;
  launch.devices = parallel::parse_device_list(f.parallel.devices, "--devices");
  launch.command = parallel::own_command_line();
  try {
    parallel::launch_cfg_workers(launch);
  } catch (const parallel::WorkersInterrupted&) {
    if (!f.quiet) std::cerr << "diffuse serve: stopped (all ranks)\n";
  }
  return 0;
}

int run_serve(ServeFlags& f) {
  if (f.options.api_key.empty())
    if (const char* env = std::getenv("DIFFUSE_API_KEY")) f.options.api_key = env;
  if (!f.options.api_key.empty() &&
      f.options.api_key.find_first_not_of(" \t\r\n") == std::string::npos)
    throw InvalidArgument("--api-key / DIFFUSE_API_KEY: the key is only whitespace");
  if (f.shutdown != "cancel" && f.shutdown != "finish")
    throw InvalidArgument("--shutdown: expected cancel or finish, got '" + f.shutdown + "'");
  if (!(f.max_body_mb > 0 && f.max_body_mb <= 4096))
    throw InvalidArgument("--max-body-mb: expected a size in (0, 4096] MB");
  f.options.limits.max_body_bytes = static_cast<size_t>(f.max_body_mb * 1024 * 1024);
  f.options.limits.max_pixels = int64_t{f.options.limits.max_side} * f.options.limits.max_side;
  if (!server::is_loopback_host(f.options.host) && f.options.api_key.empty())
    throw InvalidArgument(
        "--host " + f.options.host +
        ": listening beyond this machine needs an API key (--api-key or DIFFUSE_API_KEY)");
  const bool parallel_run = f.parallel.world > 1;
  if (parallel_run) check_serve_parallel(f);
  if (f.parallel.is_launcher()) return launch_serve_ranks(f);
  SignalWatcher signals;
  LoadOptions lo = to_load_options(f.load);
  if (f.parallel.is_worker()) lo.device = f.parallel.rank_device;
  if (!f.quiet) std::cerr << "loading " << f.model << " ...\n";
  auto engine = server::load_engine(f.model, lo, f.hidream);
  std::unique_ptr<server::GroupLeaderEngine> leader;
  if (parallel_run) {
    const auto groups = join_groups(f.parallel, parallel_mode(f.parallel), serve_parallel_job(f));
    engine->join_parallel(groups);
    if (groups.world->rank() > 0) {
      server::follow_jobs(*engine, *groups.world);
      return 0;
    }
    leader = std::make_unique<server::GroupLeaderEngine>(
        *engine, groups.world, [&signals, quiet = f.quiet](const std::string& why) {
          if (!quiet) std::cerr << "diffuse serve: the parallel group broke: " << why << "\n";
          signals.stop();
        });
    if (!f.quiet)
      std::cerr << "parallel " << (f.parallel.mode.empty() ? "cfg" : f.parallel.mode) << " over "
                << groups.world->size() << " ranks (" << groups.world->describe() << ")\n";
  }
  server::Engine& serving = leader ? static_cast<server::Engine&>(*leader) : *engine;
  server::HttpServer http(serving, f.options);
  const int port = http.bind();
  if (!f.quiet) {
    const auto& info = engine->info();
    std::cerr << "model " << engine->model_name() << " on " << info.device << " ("
              << info.unet_dtype << ", attention " << info.attention << "), loaded in "
              << info.load_s << " s\n"
              << "diffuse serve: http://" << f.options.host << ":" << port << "/"
              << (f.options.api_key.empty() ? "" : " (API key required)") << "\n";
  }
  signals.watch(http, f.shutdown == "cancel", f.quiet);
  http.serve();
  http.stop(f.shutdown == "cancel");
  if (leader) {
    // A FileStore (the local launcher's) outlives every rank; a TCPStore is served from here.
    const bool store_here = !f.parallel.master_addr.empty();
    leader->release_followers(
        store_here ? std::chrono::milliseconds(static_cast<int64_t>(f.parallel.timeout_s * 1000))
                   : std::chrono::milliseconds(0));
    if (const auto why = leader->broken(); !why.empty())
      throw Error("the server stopped: its parallel group broke (" + why + ")");
  }
  if (!f.quiet) std::cerr << "diffuse serve: stopped\n";
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  app.add_option("-m,--model", f->model, "Diffusers folder or single-file .safetensors checkpoint")
      ->required();
  app.add_option("--host", f->options.host,
                 "Address to listen on (beyond loopback needs --api-key)")
      ->capture_default_str();
  app.add_option("--port", f->options.port, "Port (0 = any free port)")
      ->capture_default_str()
      ->check(int_range(0, 65535, "a TCP port"));
  app.add_option("--api-key", f->options.api_key,
                 "Require 'Authorization: Bearer KEY' on every API request (env DIFFUSE_API_KEY)");
  app.add_option("--queue", f->options.max_waiting,
                 "Jobs that may wait behind the running one (then 503)")
      ->capture_default_str()
      ->check(int_range(0, 100000, "a queue length"));
  app.add_option("--cors", f->options.cors_origin, "Allow cross-origin requests from this origin");
  app.add_option("--shutdown", f->shutdown, "On SIGINT/SIGTERM: cancel or finish the running job")
      ->capture_default_str();
  app.add_option("--max-steps", f->options.limits.max_steps, "Most steps a request may ask")
      ->capture_default_str()
      ->check(int_range(1, 10000, "a number of steps"));
  app.add_option("--max-images", f->options.limits.max_images, "Most images per request")
      ->capture_default_str()
      ->check(int_range(1, 1000, "a number of images"));
  app.add_option("--max-side", f->options.limits.max_side,
                 "Largest width/height of a generated image")
      ->capture_default_str()
      ->check(int_range(8, 65536, "an image side in pixels"));
  app.add_option("--max-body-mb", f->max_body_mb, "Largest request body in MB")
      ->capture_default_str();
  app.add_option("--keep-jobs", f->options.keep_finished,
                 "Finished jobs (and images) kept for clients")
      ->capture_default_str()
      ->check(int_range(0, 100000, "a number of jobs"));
  app.add_option("--lora-dir", f->options.lora_dir,
                 "Folder of LoRA files that <lora:NAME:SCALE> in a prompt refers to; each job "
                 "swaps its adapters in without reloading the model")
      ->check(CLI::ExistingDirectory);
  app.add_option("--controlnet-dir", f->options.controlnet_dir,
                 "Folder of ControlNet folders (diffusers layout) that requests name (native "
                 "controlnets[].model, A1111's alwayson_scripts.controlnet)")
      ->check(CLI::ExistingDirectory);
  app.add_flag("-q,--quiet", f->quiet, "No log output");
  add_load_flags(app, f->load);
  app.add_option("--transformer", f->hidream.transformer,
                 "HiDream/FLUX: component folder of the transformer weights, or one "
                 "*.safetensors/*.gguf file of them (FLUX also in BFL's original names)")
      ->capture_default_str();
  app.add_option("--e1-lora", f->hidream.e1_lora,
                 "HiDream-E1-Full: peft LoRA file on the I1 transformer (the server then runs "
                 "edit jobs only)");
  app.add_option("--lora-alpha", f->hidream.lora_alpha, "peft lora_alpha of --e1-lora");
  app.add_option("--lora-rank", f->hidream.lora_rank, "peft r of --e1-lora");
  add_parallel_flags(app, f->parallel);
  return [f]() {
    ServeFlags mine = *f;
    bool json = false;
    return run_parallel_command(mine.parallel, mine.load.device, mine.quiet, json,
                                [&] { return run_serve(mine); });
  };
}

}  // namespace diffuse::app
