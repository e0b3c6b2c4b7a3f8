// Ulysses sequence parallelism (src/parallel/ulysses.h) for HiDream's transformer, alone and
// with HiDream's CFG-parallel (cfg,ulysses): the
// all-to-all exchanges against plain slicing, the transformer over 2-4 ranks against one device
// (float64 reference, square and padded non-square latents, more ranks than heads), the First-
// Block Cache deciding alike on every rank, every golden HiDream pipeline case on 2 and 4 ranks
// and under cfg and cfg,ulysses, and the CLI: local ranks in every mode, two "hosts" meeting at
// MASTER_ADDR 127.0.0.1, and the groups that must fail (another seed, another group size, a port in
// use, nobody at the address) within their timeout. Ranks are threads of this process (library) or
// processes (CLI), one intra-op thread each.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include "accel/dit_cache.h"
#include "cli_run.h"
#include "diffuse/image.h"
#include "hidream_test_util.h"
#include "io/json_config.h"
#include "models/hidream_transformer.h"
#include "parallel/ulysses.h"
#include "rank_group_test_util.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_sequence_parallel {

namespace fs = std::filesystem;
using test::with_group;

TEST(Ulysses, SpansCoverEveryItemOnceEarlierRunsLonger) {
  for (int64_t total : {0, 1, 5, 7, 20})
    for (int parts : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int i = 0; i < parts; ++i) {
        const auto s = parallel::even_span(total, parts, i);
        EXPECT_EQ(s.first, next);
        EXPECT_GE(s.count, i + 1 < parts ? parallel::even_span(total, parts, i + 1).count : 0);
        next += s.count;
      }
      EXPECT_EQ(next, total);
    }
}

// to_heads / to_rows / gather_rows against slicing the whole tensors, for head and token counts
// the group does not divide (and more ranks than heads), in float32 and bfloat16.
TEST(Ulysses, ExchangesTradeTokensForHeadsAndBack) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (int world : {2, 3}) {
      const int64_t B = 2, S = 7, H = world == 3 ? 2 : 5, D = 3, T = 4;
      torch::manual_seed(1);
      const auto q = torch::randn({B, S, H, D}).to(dtype), k = torch::randn({B, S, H, D}).to(dtype);
      const auto text = torch::randn({B, T, H, D}).to(dtype);
      with_group(world, [&](parallel::RankGroup& g) {
        parallel::UlyssesShard u(g, H, S);
        const auto rows = u.rows(), heads = u.heads();
        auto got = u.to_heads({u.local_rows(q), u.local_rows(k)});
        ASSERT_EQ(got.size(), 2u);
        EXPECT_TRUE(torch::equal(got[0], q.narrow(2, heads.first, heads.count)));
        EXPECT_TRUE(torch::equal(got[1], k.narrow(2, heads.first, heads.count)));
        auto [image, txt] = u.to_rows(got[0], text.narrow(2, heads.first, heads.count));
        EXPECT_TRUE(torch::equal(image, q.narrow(1, rows.first, rows.count)));
        EXPECT_TRUE(torch::equal(txt, text));
        EXPECT_TRUE(torch::equal(u.gather_rows(image), q));
        EXPECT_GT(g.bytes_sent(), 0);
      });
    }
}

TEST(Ulysses, RefusesGroupsItCannotSplit) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  EXPECT_THROW(parallel::check_ulysses_group(4, 1), InvalidArgument);
  EXPECT_THROW(parallel::check_ulysses_group(0, 2), InvalidArgument);
  with_group(3, [&](parallel::RankGroup& g) {
    const auto msg = test::expect_throw<InvalidArgument>([&] { parallel::UlyssesShard(g, 4, 2); });
    EXPECT_NE(msg.find("2 image tokens"), std::string::npos) << msg;
  });
}

// ---- the transformer ----

struct TransformerInputs {
  torch::Tensor x, t, t5, llama, pooled;
};

TransformerInputs random_inputs(const models::HiDreamTransformerConfig& c, int64_t h, int64_t w,
                                torch::Dtype dtype) {
  torch::manual_seed(7);
  const int64_t B = 2;
  TransformerInputs in;
  in.x = torch::randn({B, c.in_channels, h, w});
  in.t = torch::tensor({700.0f, 300.0f});
  in.t5 = torch::randn({B, 5, c.caption_channels[0]});
  in.llama = torch::randn({2, B, 3, c.caption_channels[1]});
  in.pooled = torch::randn({B, c.text_emb_dim});
  for (auto* t : {&in.x, &in.t5, &in.llama, &in.pooled}) *t = t->to(dtype);
  return in;
}

models::HiDreamImageTransformer2DModel tiny_model(torch::Dtype dtype) {
  torch::manual_seed(3);
  models::HiDreamImageTransformer2DModel m(models::HiDreamTransformerConfig::from_json(
      io::JsonConfig(test::tiny_hidream_config(), "config.json")));
  m->to(dtype);
  m->eval();
  return m;
}

// Every rank's output against a float64 run on one device: the split changes only how the
// float32 sums are blocked, so each element stays within float32 rounding of a forward pass
// this small (the errors measured are ~1e-6 of the output's scale).
TEST(Ulysses, TransformerOnTwoToFourRanksMatchesOneDevice) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  torch::NoGradGuard no_grad;
  auto model = tiny_model(torch::kFloat32);
  auto model64 = tiny_model(torch::kFloat64);
  const auto& c = model->config();
  // 8x8 latent: 16 tokens, unpadded; 8x4: 8 tokens padded to max_seq 16 with the key mask.
  for (auto [h, w] : {std::pair<int64_t, int64_t>{8, 8}, {8, 4}}) {
    const auto in = random_inputs(c, h, w, torch::kFloat32);
    const auto ref = model64->forward(in.x.to(torch::kFloat64), in.t, in.t5.to(torch::kFloat64),
                                      in.llama.to(torch::kFloat64), in.pooled.to(torch::kFloat64));
    const double scale = ref.abs().max().item<double>();
    const auto one = model->forward(in.x, in.t, in.t5, in.llama, in.pooled);
    const double one_err = (one.to(torch::kFloat64) - ref).abs().max().item<double>();
    for (int world : {2, 4}) {  // 4 ranks > the config's 3 heads: one rank holds none
      std::mutex m;
      std::vector<torch::Tensor> outs;
      with_group(world, [&](parallel::RankGroup& g) {
        models::HiDreamForwardOptions o;
        o.sequence_group = &g;
        auto out = model->forward(in.x, in.t, in.t5, in.llama, in.pooled, o);
        std::lock_guard<std::mutex> lock(m);
        outs.push_back(out);
      });
      ASSERT_EQ(outs.size(), static_cast<size_t>(world));
      for (const auto& out : outs) {
        EXPECT_TRUE(torch::equal(out, outs[0])) << "ranks differ";
        const double err = (out.to(torch::kFloat64) - ref).abs().max().item<double>();
        EXPECT_LE(err, 1e-5 * scale)
            << h << "x" << w << " on " << world << " ranks (one device: " << one_err << ", scale "
            << scale << ")";
      }
    }
  }
}

TEST(Ulysses, FirstBlockCacheDecidesAlikeOnEveryRank) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  torch::NoGradGuard no_grad;
  auto model = tiny_model(torch::kFloat32);
  const auto& c = model->config();
  const auto in = random_inputs(c, 8, 8, torch::kFloat32);
  DitCacheOptions opts = accel::parse_dit_cache("fbcache:0.3");
  opts.warmup = 0;
  // Six calls whose inputs drift slowly: some reuse, and every rank must reuse the same ones.
  const auto run = [&](parallel::RankGroup* g) {
    accel::DitCache cache(opts, c.num_layers, c.num_single_layers);
    std::vector<torch::Tensor> outs;
    for (int step = 0; step < 6; ++step) {
      cache.begin_step(step, 6);
      models::HiDreamForwardOptions o;
      o.cache = &cache;
      o.sequence_group = g;
      outs.push_back(model->forward(in.x * (1 + 0.02 * step), in.t - 5.0 * step, in.t5, in.llama,
                                    in.pooled, o));
    }
    return std::make_pair(cache.cached_calls(), outs);
  };
  const auto [single_cached, single_outs] = run(nullptr);
  std::mutex m;
  std::vector<int> cached;
  with_group(2, [&](parallel::RankGroup& g) {
    auto [n, outs] = run(&g);
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_LE((outs[i] - single_outs[i]).abs().max().item<double>(),
                1e-5 * single_outs[i].abs().max().item<double>())
          << "call " << i;
    std::lock_guard<std::mutex> lock(m);
    cached.push_back(n);
  });
  EXPECT_GT(single_cached, 0);
  EXPECT_EQ(cached, std::vector<int>(2, single_cached));
}

// ---- the golden pipeline cases ----

// Every pipeline case of the golden set in `dir` (HiDream's by default), run by every rank of
// `world` split into `cfg_ways` branch shares; returns the cases run.
int run_golden_pipeline_cases(int world, int cfg_ways,
                              const std::string& dir = test::hidream_golden_dir()) {
  const auto set = verify::GoldenSet::load(dir);
  int cases = 0;
  test::with_groups(world, cfg_ways, [&](parallel::ParallelGroups& g) {
    verify::VerifyOptions o;
    o.sequence_group = g.sequence;
    o.cfg_group = g.cfg;
    for (const auto& c : set.cases) {
      if (c.component != "pipeline") continue;
      const auto r = verify::run_case(set, c, o);
      EXPECT_TRUE(r.passed) << c.name << " on rank " << g.world->rank() << " of " << world << " ("
                            << cfg_ways << " branch shares): " << r.reason;
      if (g.world->rank() == 0) ++cases;
    }
  });
  return cases;
}

#define SKIP_WITHOUT_HIDREAM_SET()                             \
  SKIP_WITHOUT_CPU_COLLECTIVES();                              \
  if (!fs::exists(test::hidream_golden_dir() + "/cases.json")) \
  GTEST_SKIP() << "no HiDream golden set at " << test::hidream_golden_dir()

TEST(Ulysses, GoldenHiDreamPipelineCasesPassOnTwoAndFourRanks) {
  SKIP_WITHOUT_HIDREAM_SET();
  EXPECT_GT(run_golden_pipeline_cases(2, 1), 0) << "the set has no pipeline cases";
  run_golden_pipeline_cases(4, 1);
}

// CFG-parallel: I1's two branches and E1's three over 2 and 3 ranks (E1-Full's two-branch refine
// phase then runs whole on each of the 3); cfg,ulysses: 2 branch shares x 2 token shares.
TEST(Ulysses, GoldenHiDreamPipelineCasesPassWithCfgAndCfgUlysses) {
  SKIP_WITHOUT_HIDREAM_SET();
  EXPECT_GT(run_golden_pipeline_cases(2, 2), 0);
  run_golden_pipeline_cases(3, 3);
  run_golden_pipeline_cases(4, 2);
}

// FLUX.1 dev/schnell (true CFG's two-row batch too) and Kontext (its reference tokens split
// with the target's) on 2 and 3 ranks (3 > the sets' 2 heads).
TEST(Ulysses, GoldenFluxAndKontextPipelineCasesPassOnTwoAndThreeRanks) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  int sets = 0;
  for (const auto& dir : {test::flux_golden_dir(), test::flux_kontext_golden_dir()}) {
    if (!fs::exists(dir + "/cases.json")) continue;
    ++sets;
    EXPECT_GT(run_golden_pipeline_cases(2, 1, dir), 0) << dir << " has no pipeline cases";
    run_golden_pipeline_cases(3, 1, dir);
  }
  if (sets == 0) GTEST_SKIP() << "no FLUX golden sets at " << test::flux_golden_dir();
}

// ---- the CLI ----

using test::CliRun;
using test::run_cli;

std::string golden_model() {
  return test::hidream_golden_dir() + "/model";
}

std::vector<std::string> t2i_args(const std::string& out, const std::string& seed = "3") {
  return {"txt2img", "-m", golden_model(), "-p", "a red fox", "-n", "blurry", "--steps", "2",
          "-W",      "64", "-H",           "64", "--seed",    seed, "-o",     out};
}

using test::worst_pixel_difference;

#define SKIP_WITHOUT_GOLDEN_MODEL()                      \
  SKIP_WITHOUT_CPU_COLLECTIVES();                        \
  if (!fs::exists(golden_model() + "/model_index.json")) \
  GTEST_SKIP() << "no HiDream golden model at " << golden_model()

// Local ranks in each mode give one process's image; every rank held the same latents after
// every step, and only rank 0 wrote.
TEST(Ulysses, CliLocalRanksInEveryModeMatchOneProcess) {
  SKIP_WITHOUT_GOLDEN_MODEL();
  test::TempDir dir;
  auto one = run_cli(t2i_args(dir.file("one.png")), dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (const auto& [devices, mode] : {std::pair<std::string, std::string>{"cpu,cpu", "ulysses"},
                                      {"cpu,cpu", "cfg"},
                                      {"cpu,cpu,cpu,cpu", "cfg,ulysses"}}) {
    const std::string out = dir.file(mode + ".png"), log = dir.file(mode + ".hashes");
    auto args = t2i_args(out);
    args.insert(args.end(), {"--devices", devices, "--parallel", mode, "--cfg-hash-log", log});
    auto run = run_cli(args, dir);
    ASSERT_EQ(run.exit_code, 0) << mode << ": " << run.err;
    EXPECT_EQ(run.out.find(out), run.out.rfind(out)) << run.out;  // rank 0 writes
    const int ranks = devices == "cpu,cpu" ? 2 : 4;
    std::string first;
    for (int r = 0; r < ranks; ++r) {
      std::ifstream in(log + ".rank" + std::to_string(r));
      std::stringstream lines;
      lines << in.rdbuf();
      if (r == 0) first = lines.str();
      EXPECT_FALSE(lines.str().empty()) << mode << " rank " << r;
      EXPECT_EQ(lines.str(), first) << mode << " rank " << r;
    }
    EXPECT_LE(worst_pixel_difference(dir.file("one.png"), out), 1) << mode;
  }
}

TEST(Ulysses, CliFluxOnTwoLocalRanksMatchesOneProcess) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  const auto flux = test::flux_golden_dir() + "/model";
  if (!fs::exists(flux + "/model_index.json")) GTEST_SKIP() << "no FLUX golden model at " << flux;
  test::TempDir dir;
  auto args = t2i_args(dir.file("one.png"));
  args[2] = flux;
  auto one = run_cli(args, dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  args.back() = dir.file("two.png");
  args.insert(args.end(), {"--devices", "cpu,cpu", "--parallel", "ulysses"});
  auto two = run_cli(args, dir);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_LE(worst_pixel_difference(dir.file("one.png"), dir.file("two.png")), 1);
}

// A port nobody listens on right now (the kernel's pick for a socket just closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Each launch as a host would start it: its own rank and the group's meeting place.
std::vector<std::string> host_args(const std::string& out, int rank, int world, int port,
                                   const std::string& seed = "3") {
  auto args = t2i_args(out, seed);
  args.insert(args.end(), {"--parallel", "ulysses", "--rank", std::to_string(rank), "--world-size",
                           std::to_string(world), "--master-addr", "127.0.0.1", "--master-port",
                           std::to_string(port), "--parallel-join-timeout", "60"});
  return args;
}

// Runs the launches side by side (each in its own folder, as on separate hosts).
std::vector<CliRun> run_side_by_side(const std::vector<std::vector<std::string>>& launches,
                                     const std::vector<std::string>& envs = {}) {
  std::vector<CliRun> runs(launches.size());
  std::vector<std::unique_ptr<test::TempDir>> dirs;
  for (size_t i = 0; i < launches.size(); ++i) dirs.push_back(std::make_unique<test::TempDir>());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < launches.size(); ++i)
    threads.emplace_back(
        [&, i] { runs[i] = run_cli(launches[i], *dirs[i], i < envs.size() ? envs[i] : ""); });
  for (auto& t : threads) t.join();
  return runs;
}

TEST(Ulysses, TwoHostsMeetAtMasterAddrAndMatchOneProcess) {
  SKIP_WITHOUT_GOLDEN_MODEL();
  test::TempDir dir;
  auto one = run_cli(t2i_args(dir.file("one.png")), dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const int port = free_port();
  // Rank 0 by flags; rank 1 by torchrun's environment variables.
  auto runs = run_side_by_side(
      {host_args(dir.file("two.png"), 0, 2, port),
       {"txt2img", "-m", golden_model(), "-p", "a red fox", "-n", "blurry", "--steps", "2", "-W",
        "64", "-H", "64", "--seed", "3", "-o", dir.file("rank1.png"), "--parallel", "ulysses"}},
      {"", "RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
               std::to_string(port)});
  ASSERT_EQ(runs[0].exit_code, 0) << runs[0].err;
  ASSERT_EQ(runs[1].exit_code, 0) << runs[1].err;
  EXPECT_FALSE(fs::exists(dir.file("rank1.png")));  // only rank 0 writes
  EXPECT_LE(worst_pixel_difference(dir.file("one.png"), dir.file("two.png")), 1);
}

TEST(Ulysses, GroupsThatCannotRunFailWithinTheirTimeoutNamingWhy) {
  SKIP_WITHOUT_GOLDEN_MODEL();
  test::TempDir dir;
  const auto expect_failure = [](const CliRun& r, const std::string& part) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
  };
  {  // another seed on rank 1: both ranks refuse, naming the line
    const int port = free_port();
    auto runs = run_side_by_side({host_args(dir.file("a.png"), 0, 2, port, "3"),
                                  host_args(dir.file("b.png"), 1, 2, port, "4")});
    for (const auto& r : runs) expect_failure(r, "seed=");
    EXPECT_FALSE(fs::exists(dir.file("a.png")));
  }
  {  // rank 1 believes in a group of 3
    const int port = free_port();
    auto runs = run_side_by_side(
        {host_args(dir.file("a.png"), 0, 2, port), host_args(dir.file("b.png"), 1, 3, port)});
    for (const auto& r : runs) expect_failure(r, "group's size");
  }
  {  // nobody serves the address: rank 1 gives up after its join timeout
    auto args = host_args(dir.file("a.png"), 1, 2, free_port());
    args.back() = "3";
    expect_failure(run_cli(args, dir), "could not reach the store");
  }
  {  // rank 0's port is taken
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(fd, 1), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    auto args = host_args(dir.file("a.png"), 0, 2, ntohs(a.sin_port));
    args.back() = "3";
    expect_failure(run_cli(args, dir), "could not serve the store");
    ::close(fd);
  }
  // Flags before anything loads.
  auto no_seed = t2i_args(dir.file("a.png"));
  no_seed.erase(no_seed.begin() + 13, no_seed.begin() + 15);  // --seed 3
  no_seed.insert(no_seed.end(), {"--parallel", "ulysses", "--rank", "0", "--world-size", "2",
                                 "--master-addr", "127.0.0.1", "--master-port", "1"});
  expect_failure(run_cli(no_seed, dir), "--seed");
  auto no_place = t2i_args(dir.file("a.png"));
  no_place.insert(no_place.end(), {"--parallel", "ulysses"});
  expect_failure(run_cli(no_place, dir), "torchrun");
  auto outside = host_args(dir.file("a.png"), 2, 2, 1);
  expect_failure(run_cli(outside, dir), "outside a group of 2");
  auto cfg = t2i_args(dir.file("a.png"));
  cfg.insert(cfg.end(), {"--devices", "cpu,cpu,cpu"});  // txt2img has two branches
  expect_failure(run_cli(cfg, dir), "at most one rank per branch");
  auto odd = t2i_args(dir.file("a.png"));
  odd.insert(odd.end(), {"--devices", "cpu,cpu,cpu", "--parallel", "cfg,ulysses"});
  expect_failure(run_cli(odd, dir), "2 x N ranks");
  const auto flux = test::flux_golden_dir() + "/model";
  if (fs::exists(flux + "/model_index.json")) {
    auto flux_cfg = t2i_args(dir.file("a.png"));
    flux_cfg[2] = flux;
    flux_cfg.insert(flux_cfg.end(), {"--devices", "cpu,cpu", "--parallel", "cfg"});
    expect_failure(run_cli(flux_cfg, dir),
                   "FLUX shares its work over ranks with --parallel ulysses");
  }
  auto unguided = t2i_args(dir.file("a.png"));
  unguided.insert(unguided.end(), {"--devices", "cpu,cpu", "--cfg-scale", "1"});
  expect_failure(run_cli(unguided, dir), "guidance is off");
  EXPECT_FALSE(fs::exists(dir.file("a.png")));
}

}  // namespace test_sequence_parallel
}  // namespace diffuse
