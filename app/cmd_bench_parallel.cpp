// `diffuse bench parallel`: a HiDream transformer call (HiDream-I1's width, heads and experts, a
// few of its blocks) on 1, 2 and 4 CPU processes of one intra-op thread each, under Ulysses
// sequence parallelism: time per call, speed-up against one process, and the bytes each rank
// sends per call (bench/parallel_bench.h). Each count runs as its own set of worker processes
// (this command again, with hidden flags) meeting through a FileStore.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/parallel_bench.h"
#include "commands.h"
#include "device/cpu_threads.h"
#include "diffuse/errors.h"
#include "flag_checks.h"
#include "io/atomic_file.h"
#include "parallel/process_group.h"
#include "parallel/worker_processes.h"

namespace diffuse::app {
namespace {

struct BenchParallelFlags {
  bench::ParallelBenchOptions opts;
  std::vector<int> ranks{1, 2, 4};
  bool json = false;
  double timeout_s = 600;
  int worker_rank = -1, worker_world = 0;  // hidden: a worker's place
  std::string store, result;               // hidden: its store and (rank 0) result file
};

int run_bench_worker(const BenchParallelFlags& f) {
  at::set_num_threads(1);
  std::shared_ptr<parallel::RankGroup> group;
  if (f.worker_world > 1) {
    parallel::GroupOptions o;
    o.rank = f.worker_rank;
    o.world = f.worker_world;
    o.store_file = f.store;
    o.purpose = "bench parallel";
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
    group = parallel::connect_group(o);
  }
  const auto r = bench::run_parallel_bench_rank(f.opts, group.get());
  if (f.worker_rank == 0)
    io::write_file_atomically(f.result,
                              [&](std::ostream& out) { out << bench::to_json(r).dump(); });
  return 0;
}

bench::ParallelBenchRank run_count(const BenchParallelFlags& f, int n) {
  parallel::PrivateTempDir dir;
  const std::string result = dir.path() + "/result.json";
  std::vector<parallel::WorkerSpec> specs;
  for (int r = 0; r < n; ++r) {
    parallel::WorkerSpec w;
    w.label = "rank " + std::to_string(r) + " of " + std::to_string(n);
    w.argv = parallel::own_command_line();
    w.argv.insert(w.argv.end(),
                  {"--bench-rank", std::to_string(r), "--bench-world", std::to_string(n),
                   "--bench-store", dir.path() + "/store", "--bench-result", result});
    w.env = {"DIFFUSE_THREADS=1", "OMP_NUM_THREADS=1"};
    specs.push_back(w);
  }
  parallel::run_workers(specs, std::chrono::seconds(10));
  std::ifstream in(result);
  return bench::parallel_bench_rank_from_json(nlohmann::json::parse(in));
}

}  // namespace

std::pair<CLI::App*, Command> add_bench_parallel(CLI::App& bench) {
  auto f = std::make_shared<BenchParallelFlags>();
  CLI::App* sub = bench.add_subcommand(
      "parallel",
      "Ulysses sequence parallelism: a HiDream transformer call on 1, 2 and 4 CPU processes (one "
      "thread each), time and bytes sent per call");
  sub->add_option("--side", f->opts.side, "Latent pixels per side ((side/2)^2 image tokens)")
      ->capture_default_str()
      ->check(int_range(2, 512, "an even side"));
  sub->add_option("--batch", f->opts.batch, "Images per call (2: a CFG batch)")
      ->capture_default_str()
      ->check(int_range(1, 16, "a batch"));
  sub->add_option("--dual-blocks", f->opts.dual_blocks, "Dual-stream blocks (HiDream-I1 has 16)")
      ->capture_default_str()
      ->check(int_range(0, 16, "a block count"));
  sub->add_option("--single-blocks", f->opts.single_blocks,
                  "Single-stream blocks (HiDream-I1 has 32)")
      ->capture_default_str()
      ->check(int_range(0, 32, "a block count"));
  sub->add_option("--calls", f->opts.calls, "Timed calls per process count, after a warm-up")
      ->capture_default_str()
      ->check(int_range(1, 100, "a number of calls"));
  sub->add_option("--ranks", f->ranks, "Process counts to compare")
      ->delimiter(',')
      ->check(int_range(1, 64, "a process count"));
  sub->add_option("--parallel-timeout", f->timeout_s, "Seconds a rank waits at each exchange")
      ->capture_default_str()
      ->check(number_range(1.0, 86400.0, "seconds"));
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  sub->add_option("--bench-rank", f->worker_rank)->group("");
  sub->add_option("--bench-world", f->worker_world)->group("");
  sub->add_option("--bench-store", f->store)->group("");
  sub->add_option("--bench-result", f->result)->group("");
  Command run = [f]() {
    if (f->worker_rank >= 0) return run_bench_worker(*f);
    std::vector<bench::ParallelBenchRank> rows;
    for (int n : f->ranks) {
      if (!f->json) std::cerr << "bench parallel: " << n << " process(es) ...\n";
      rows.push_back(run_count(*f, n));
    }
    if (f->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : rows) out.push_back(bench::to_json(r));
      std::cout
          << nlohmann::json{{"cores", std::thread::hardware_concurrency()}, {"rows", out}}.dump(2)
          << "\n";
      return 0;
    }
    const auto& r0 = rows.front();
    std::printf(
        "HiDream-I1 width, %d dual + %d single blocks (%.0fM parameters), %d image + %d text "
        "tokens, batch %d, float32, one thread per process, %u cores\n",
        f->opts.dual_blocks, f->opts.single_blocks, r0.params_m, r0.image_tokens, r0.text_tokens,
        f->opts.batch, std::thread::hardware_concurrency());
    for (const auto& r : rows)
      std::printf(
          "  %2d process(es): best %7.3f s  mean %7.3f s per call  %5.2fx of %d  "
          "sent %8.2f MiB per rank per call\n",
          r.ranks, r.best_s, r.mean_s, r0.best_s / r.best_s, r0.ranks,
          r.bytes_sent_per_call / 1048576.0);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
