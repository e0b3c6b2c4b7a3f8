// What the parallel tests share: groups of ranks as `world` threads of this process, each with
// its own rank of one Gloo group on 127.0.0.1 (a FileStore in a temporary folder), and the
// comparison of a parallel run's PNG with one process's.
#pragma once
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "parallel/process_group.h"
#include "test_util.h"

namespace diffuse::test {

// PyTorch's pip wheels come without Gloo's headers: such a build has no CPU collectives, and
// the parallel tests have nothing to run there.
inline bool have_cpu_collectives() {
  try {
    parallel::backend_for(torch::Device(torch::kCPU));
    return true;
  } catch (const Error&) {
    return false;
  }
}
#define SKIP_WITHOUT_CPU_COLLECTIVES() \
  if (!::diffuse::test::have_cpu_collectives()) GTEST_SKIP() << "this build has no Gloo"

// Runs `body(groups)` on `world` threads, one rank each, split into `cfg_ways` branch shares
// (parallel::connect_groups); rethrows the first rank's failure.
inline void with_groups(int world, int cfg_ways,
                        const std::function<void(parallel::ParallelGroups&)>& body) {
  TempDir dir;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        parallel::GroupOptions o;
        o.rank = r;
        o.world = world;
        o.store_file = dir.file("store");
        o.timeout = std::chrono::seconds(60);
        auto groups = parallel::connect_groups(o, cfg_ways);
        body(groups);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Runs `body(group)` on `world` threads, one rank each of one group.
inline void with_group(int world, const std::function<void(parallel::RankGroup&)>& body) {
  with_groups(world, 1, [&](parallel::ParallelGroups& g) { body(*g.world); });
}

// The largest difference of one 8-bit channel between two PNGs; 256 when their sizes differ.
inline int worst_pixel_difference(const std::string& a_path, const std::string& b_path) {
  const auto a = read_png(a_path), b = read_png(b_path);
  if (a.rgb.size() != b.rgb.size()) return 256;
  int worst = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) worst = std::max(worst, std::abs(a.rgb[i] - b.rgb[i]));
  return worst;
}

}  // namespace diffuse::test
