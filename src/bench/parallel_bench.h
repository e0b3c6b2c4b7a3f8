// `diffuse bench parallel`: one HiDream transformer call (HiDream-I1's width, heads and experts;
// a few of its blocks) timed on one rank of a Ulysses group, or on one device, with the bytes a
// rank sends per call. The CLI runs it on 1, 2 and 4 processes of one intra-op thread each and
// prints them side by side.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::bench {

struct ParallelBenchOptions {
  int side = 32;  // latent pixels per side: (side / 2)^2 image tokens
  int batch = 1;
  int dual_blocks = 1, single_blocks = 1;  // of HiDream-I1's 16 + 32
  int calls = 3;                           // timed, after one warm-up call
  uint64_t seed = 0;
};

struct ParallelBenchRank {
  int ranks = 1;
  int image_tokens = 0, text_tokens = 0;
  double best_s = 0, mean_s = 0;  // per transformer call
  int64_t bytes_sent_per_call = 0;
  double params_m = 0;
};

// Builds the model (the same seeded weights on every rank) and times its calls; with `group`,
// under Ulysses over it (every rank of the group must call this with the same options).
ParallelBenchRank run_parallel_bench_rank(const ParallelBenchOptions& options,
                                          parallel::RankGroup* group);

nlohmann::json to_json(const ParallelBenchRank& r);
ParallelBenchRank parallel_bench_rank_from_json(const nlohmann::json& j);

}  // namespace diffuse::bench
