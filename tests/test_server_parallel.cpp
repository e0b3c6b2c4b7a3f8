// A parallel server (`diffuse serve --devices` / torchrun ranks, src/server/rank_jobs.h): the
// job's bytes (every field travels), two ranks as threads of this process that give one
// process's images, cancel and interrupt at the same step on every rank and go on with the
// next job, a job every rank refuses, HiDream under Ulysses; then the CLI as two "hosts" on the
// loopback interface, and a rank that dies stopping the server with a message naming it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "rank_group_test_util.h"
#include "server/base64.h"
#include "server/hidream_engine.h"
#include "server/job_wire.h"
#include "server/rank_jobs.h"
#include "server/sd_engine.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_parallel {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDemo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
const std::string kDemoEdit = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo-edit";
const char* const kScene =
    "a red circle on the left and a blue square on the right on a yellow "
    "background";

LoadOptions cpu_fp32() {
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "fp32";
  return lo;
}

server::JobRequest demo_job(uint64_t seed, int steps = 6) {
  server::JobRequest r;
  r.config.prompts = {kScene};
  r.config.negative_prompts = {"blurry"};
  r.config.steps = steps;
  r.config.guidance_scale = 7.0;
  r.config.seed = seed;
  return r;
}

// The queue's side of a job, scripted: `stop_at` (1-based step) cancels or finishes there.
class ScriptedContext : public server::JobContext {
 public:
  enum class Act { kNone, kCancel, kFinish };
  explicit ScriptedContext(Act act = Act::kNone, int stop_at = 0) : act_(act), stop_at_(stop_at) {}
  StepAction step(int done, int /*total*/, std::string /*preview*/) override {
    steps = done;
    if (done < stop_at_ || act_ == Act::kNone) return true;
    return act_ == Act::kCancel ? StepAction(false) : StepAction::finish_now();
  }
  bool cancelled() const override { return act_ == Act::kCancel && steps >= stop_at_; }
  bool interrupted() const override { return act_ == Act::kFinish && steps >= stop_at_; }
  int steps = 0;

 private:
  Act act_;
  int stop_at_;
};

int worst_difference(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height) return 256;
  int worst = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) worst = std::max(worst, std::abs(a.rgb[i] - b.rgb[i]));
  return worst;
}

double mean_difference(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height || a.rgb.empty()) return 256;
  double sum = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) sum += std::abs(a.rgb[i] - b.rgb[i]);
  return sum / static_cast<double>(a.rgb.size());
}

Image first_image(const server::JobOutput& out) {
  EXPECT_FALSE(out.images.empty());
  if (out.images.empty()) return {};
  return decode_png(out.images[0].png, "job image", 1u << 24);
}

// ---- the job's bytes ----

TEST(JobWire, EveryFieldOfAJobTravels) {
  server::JobRequest r = demo_job(123456789012345ull);
  r.kind = server::JobKind::edit;
  auto& c = r.config;
  c.prompts = {"a", "b \xc3\xa9"};
  c.negative_prompts = {"n"};
  c.width = 192;
  c.height = 64;
  c.strength = 0.35;
  c.images_per_prompt = 2;
  c.scheduler = "euler_a";
  c.eta = 0.5;
  c.prompt_syntax = "a1111";
  c.deep_cache = {3, 1, 2, true};
  c.token_merging.ratio = 0.4;
  c.token_merging.layers = {"down_blocks.0.attentions.1"};
  c.token_merging.always = true;
  c.denoising_start = 0.25;
  c.denoising_end = 0.75;
  c.cuda_graph = true;
  c.dit_cache.method = DitCacheOptions::Method::kBlockSchedule;
  c.dit_cache.threshold = 0.07;
  c.dit_cache.interval = 4;
  c.dit_cache.order = 2;
  c.dit_cache.first_block = 3;
  c.dit_cache.last_block = 9;
  c.dit_cache.warmup = 5;
  c.vae_tiling.mode = "on";
  c.vae_tiling.tile_size = 256;
  c.vae_tiling.overlap = 0.125;
  c.size_conditioning = {1, 2, 3, 4, 5, 6, 7.5, 1.5};
  c.loras = {{"/x/y.safetensors", 0.8}, {"z.safetensors", -1}};
  r.init_image.width = 3;
  r.init_image.height = 2;
  r.init_image.rgb = {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255, 7, 8, 9, 10, 11, 12};
  r.edit = {2.5, false, 0.3, false};
  r.batch_count = 3;
  r.preview = false;
  r.api = "a1111";

  const auto back = server::decode_job(server::encode_job(r));
  EXPECT_EQ(back.kind, r.kind);
  const auto& b = back.config;
  EXPECT_EQ(b.prompts, c.prompts);
  EXPECT_EQ(b.negative_prompts, c.negative_prompts);
  EXPECT_EQ(b.width, 192);
  EXPECT_EQ(b.height, 64);
  EXPECT_EQ(b.steps, c.steps);
  EXPECT_EQ(b.guidance_scale, c.guidance_scale);
  EXPECT_EQ(b.strength, c.strength);
  EXPECT_EQ(b.seed, c.seed);
  EXPECT_EQ(b.images_per_prompt, 2);
  EXPECT_EQ(b.scheduler, "euler_a");
  EXPECT_EQ(b.eta, 0.5);
  EXPECT_EQ(b.prompt_syntax, "a1111");
  EXPECT_EQ(b.deep_cache.interval, 3);
  EXPECT_EQ(b.deep_cache.layer_id, 1);
  EXPECT_EQ(b.deep_cache.block_id, 2);
  EXPECT_TRUE(b.deep_cache.non_uniform);
  EXPECT_EQ(b.token_merging.ratio, 0.4);
  EXPECT_EQ(b.token_merging.layers, c.token_merging.layers);
  EXPECT_TRUE(b.token_merging.always);
  EXPECT_EQ(b.denoising_start, 0.25);
  EXPECT_EQ(b.denoising_end, 0.75);
  EXPECT_TRUE(b.cuda_graph);
  EXPECT_EQ(b.dit_cache.method, DitCacheOptions::Method::kBlockSchedule);
  EXPECT_EQ(b.dit_cache.threshold, 0.07);
  EXPECT_EQ(b.dit_cache.interval, 4);
  EXPECT_EQ(b.dit_cache.order, 2);
  EXPECT_EQ(b.dit_cache.first_block, 3);
  EXPECT_EQ(b.dit_cache.last_block, 9);
  EXPECT_EQ(b.dit_cache.warmup, 5);
  EXPECT_EQ(b.vae_tiling.mode, "on");
  EXPECT_EQ(b.vae_tiling.tile_size, 256);
  EXPECT_EQ(b.vae_tiling.overlap, 0.125);
  const auto& s = b.size_conditioning;
  EXPECT_EQ(
      std::vector<double>({double(s.original_width), double(s.original_height), double(s.crop_top),
                           double(s.crop_left), double(s.target_width), double(s.target_height),
                           s.aesthetic_score, s.negative_aesthetic_score}),
      std::vector<double>({1, 2, 3, 4, 5, 6, 7.5, 1.5}));
  ASSERT_EQ(b.loras.size(), 2u);
  EXPECT_EQ(b.loras[0].path, "/x/y.safetensors");
  EXPECT_EQ(b.loras[0].scale, 0.8);
  EXPECT_EQ(b.loras[1].scale, -1);
  EXPECT_EQ(back.init_image.width, 3);
  EXPECT_EQ(back.init_image.height, 2);
  EXPECT_EQ(back.init_image.rgb, r.init_image.rgb);
  EXPECT_EQ(back.edit.image_guidance_scale, 2.5);
  EXPECT_FALSE(back.edit.clip_cfg_norm);
  EXPECT_EQ(back.edit.refine_strength, 0.3);
  EXPECT_FALSE(back.edit.auto_resize);
  EXPECT_EQ(back.batch_count, 3);
  EXPECT_FALSE(back.preview);
  EXPECT_EQ(back.api, "a1111");
  // No seed is a seed too: unset stays unset.
  server::JobRequest unseeded;
  EXPECT_FALSE(server::decode_job(server::encode_job(unseeded)).config.seed.has_value());
}

TEST(JobWire, TensorsDoNotTravelAndDamagedBytesAreRefusedByName) {
  server::JobRequest r = demo_job(1);
  r.config.latents = torch::zeros({1, 4, 8, 8});
  EXPECT_THROW(server::encode_job(r), InvalidArgument);

  const std::string good = server::encode_job(demo_job(1));
  const auto refused = [](const std::string& bytes) {
    try {
      server::decode_job(bytes);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused("").find("not a job message"), std::string::npos);
  EXPECT_NE(refused(good.substr(0, good.size() / 2)).find("parallel server job"),
            std::string::npos);
  auto j = json::from_cbor(good);
  j["version"] = 99;
  EXPECT_NE(refused(std::string(reinterpret_cast<const char*>(json::to_cbor(j).data()),
                                json::to_cbor(j).size()))
                .find("wire version"),
            std::string::npos);
  auto k = json::from_cbor(good);
  k["init_image"]["width"] = 5;  // 15 bytes of pixels expected, none given
  k["init_image"]["height"] = 1;
  const auto kb = json::to_cbor(k);
  EXPECT_NE(refused(std::string(kb.begin(), kb.end())).find("do not match"), std::string::npos);
  auto m = json::from_cbor(good);
  m["config"].erase("steps");
  const auto mb = json::to_cbor(m);
  EXPECT_NE(refused(std::string(mb.begin(), mb.end())).find("'steps'"), std::string::npos);
}

// ---- two ranks in this process ----

// Rank 0 runs `jobs` through a GroupLeaderEngine, rank 1 follows; both load `load(rank)`.
// `broken` gets the reason if the group broke.
void serve_on_two_ranks(int cfg_ways, const std::function<std::unique_ptr<server::Engine>()>& load,
                        const std::function<void(server::GroupLeaderEngine&)>& jobs) {
  test::with_groups(2, cfg_ways, [&](parallel::ParallelGroups& groups) {
    auto engine = load();
    engine->join_parallel(groups);
    if (groups.world->rank() > 0) {
      server::follow_jobs(*engine, *groups.world);
      return;
    }
    server::GroupLeaderEngine leader(*engine, groups.world, nullptr);
    jobs(leader);
    leader.release_followers(std::chrono::seconds(60));
    EXPECT_EQ(leader.broken(), "");
  });
}

std::unique_ptr<server::Engine> demo_sd_engine() {
  return std::make_unique<server::SdEngine>(kDemo, cpu_fp32());
}

TEST(ParallelServer, TwoRanksGiveOneProcessesImagesJobAfterJob) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  auto single = demo_sd_engine();
  ScriptedContext plain;
  const Image one_a = first_image(single->run(demo_job(3), plain));
  const Image one_b = first_image(single->run(demo_job(8), plain));
  Image two_a, two_b;
  serve_on_two_ranks(2, demo_sd_engine, [&](server::GroupLeaderEngine& leader) {
    ScriptedContext c;
    two_a = first_image(leader.run(demo_job(3), c));
    EXPECT_EQ(c.steps, 6);
    two_b = first_image(leader.run(demo_job(8), c));
  });
  EXPECT_LE(worst_difference(one_a, two_a), 1);  // fp32, batch of 1 vs 2 in the UNet
  EXPECT_LE(worst_difference(one_b, two_b), 1);
  EXPECT_GT(worst_difference(one_a, one_b), 16);  // the seeds differ, so do the images
}

// A cancel reaches every rank at the same step: the job ends as cancelled on rank 0, and the next
// job starts on all ranks together and gives the image of one process. An interrupt finishes
// early on every rank with the image so far; a job the pipeline refuses is refused alike.
TEST(ParallelServer, CancelInterruptAndRefusalKeepTheRanksInStep) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  auto single = demo_sd_engine();
  ScriptedContext plain;
  const Image one = first_image(single->run(demo_job(5), plain));
  ScriptedContext finish_single(ScriptedContext::Act::kFinish, 3);
  const Image one_interrupted = first_image(single->run(demo_job(5, 8), finish_single));
  Image after_cancel, interrupted, after_refusal;
  std::string refusal;
  serve_on_two_ranks(2, demo_sd_engine, [&](server::GroupLeaderEngine& leader) {
    ScriptedContext cancel(ScriptedContext::Act::kCancel, 2);
    EXPECT_THROW(leader.run(demo_job(5, 8), cancel), Cancelled);
    EXPECT_EQ(cancel.steps, 2);
    ScriptedContext c;
    after_cancel = first_image(leader.run(demo_job(5), c));
    ScriptedContext finish(ScriptedContext::Act::kFinish, 3);
    interrupted = first_image(leader.run(demo_job(5, 8), finish));
    EXPECT_EQ(finish.steps, 3);
    auto unguided = demo_job(5);
    unguided.config.guidance_scale = 1.0;  // CFG-parallel splits the guidance branches
    try {
      leader.run(unguided, c);
    } catch (const InvalidArgument& e) {
      refusal = e.what();
    }
    after_refusal = first_image(leader.run(demo_job(5), c));
  });
  EXPECT_LE(worst_difference(one, after_cancel), 2);  // fp32, batch of 1 vs 2 in the UNet
  EXPECT_LE(worst_difference(one_interrupted, interrupted), 2);
  EXPECT_GT(worst_difference(one, one_interrupted), 8);  // 3 of 8 steps is another picture
  EXPECT_NE(refusal.find("guidance"), std::string::npos) << refusal;
  // The same job on the same group: the same image, whatever ran before it.
  EXPECT_EQ(worst_difference(after_cancel, after_refusal), 0);
  EXPECT_LE(worst_difference(one, after_refusal), 2);
}

// HiDream's engine under Ulysses: an edit job of the shipped edit demo on two ranks.
TEST(ParallelServer, HiDreamEditUnderUlyssesGivesOneProcessesEdit) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  if (!fs::exists(kDemoEdit + "/model_index.json")) GTEST_SKIP() << "no " << kDemoEdit;
  const auto load = [] {
    return std::make_unique<server::HiDreamEngine>(kDemoEdit, cpu_fp32(),
                                                   server::HiDreamEngineOptions{});
  };
  server::JobRequest edit;
  edit.kind = server::JobKind::edit;
  edit.config.prompts = {
      "Editing Instruction: make the background green. Target Image "
      "Description: a red circle on the left and a blue square on the right "
      "on a green background."};
  edit.config.seed = 42;
  edit.init_image = read_png(std::string(DIFFUSE_SOURCE_DIR) + "/docs/images/demo-1.png");
  auto single = load();
  const auto d = single->defaults();
  edit.config.steps = std::min(d.steps, 6);
  edit.config.guidance_scale = d.guidance_scale;
  edit.edit.image_guidance_scale = d.image_guidance_scale;
  ScriptedContext plain;
  const Image one = first_image(single->run(edit, plain));
  Image two;
  serve_on_two_ranks(1, load, [&](server::GroupLeaderEngine& leader) {
    ScriptedContext c;
    two = first_image(leader.run(edit, c));
  });
  EXPECT_LE(worst_difference(one, two), 1);
}

// ---- the CLI: rank 0 serves, rank 1 follows, as two hosts meeting at 127.0.0.1 ----

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A `diffuse` process whose stderr is read as it comes (a thread of its own).
class CliProcess {
 public:
  explicit CliProcess(std::vector<std::string> args) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    std::vector<char*> argv;
    std::string path = DIFFUSE_CLI_PATH;
    argv.push_back(path.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> lock(mutex_);
        err_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      ::close(fd);
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      cv_.notify_all();
    });
  }
  ~CliProcess() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    if (reader_.joinable()) reader_.join();
  }
  // Whether `text` appeared on stderr before it closed (or `timeout` passed).
  bool wait_for(const std::string& text, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] {
      return err_.find(text) != std::string::npos || closed_;
    }) && err_.find(text) != std::string::npos;
  }
  // The port of the server's "http://127.0.0.1:PORT" line, once the whole line is in: stderr is
  // unbuffered, so the address and the number may arrive in separate reads.
  int port(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const std::string address = "http://127.0.0.1:";
    std::unique_lock<std::mutex> lock(mutex_);
    const auto line_in = [&] {
      const auto at = err_.find(address);
      return at != std::string::npos && err_.find('\n', at) != std::string::npos;
    };
    if (!cv_.wait_for(lock, timeout, [&] { return line_in() || closed_; }) || !line_in()) return -1;
    return std::atoi(err_.c_str() + err_.find(address) + address.size());
  }
  void signal(int sig) { ::kill(pid_, sig); }
  int wait() {  // the exit status, -1 when killed by a signal
    if (status_ < 0) {
      int s = 0;
      ::waitpid(pid_, &s, 0);
      status_ = WIFEXITED(s) ? WEXITSTATUS(s) : 1000 + WTERMSIG(s);
    }
    if (reader_.joinable()) reader_.join();
    return status_ >= 1000 ? -1 : status_;
  }
  std::string err() {
    std::lock_guard<std::mutex> lock(mutex_);
    return err_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::thread reader_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string err_;
  bool closed_ = false;
};

std::vector<std::string> host_args(int rank, int port) {
  return {"serve",
          "-m",
          kDemo,
          "--port",
          "0",
          "--dtype",
          "fp32",
          "--parallel",
          "cfg",
          "--rank",
          std::to_string(rank),
          "--world-size",
          "2",
          "--master-addr",
          "127.0.0.1",
          "--master-port",
          std::to_string(port),
          "--parallel-timeout",
          "10"};
}

json a1111_body(uint64_t seed) {
  return {{"prompt", kScene}, {"negative_prompt", "blurry"}, {"steps", 6}, {"cfg_scale", 7},
          {"seed", seed},     {"sampler_name", "DDIM"}};
}

Image a1111_image(httplib::Client& c, const json& body, int* status = nullptr) {
  auto r = c.Post("/sdapi/v1/txt2img", body.dump(), "application/json");
  if (status) *status = r ? r->status : -1;
  if (!r || r->status != 200) return {};
  const auto j = json::parse(r->body);
  return decode_png(server::base64_decode(j["images"][0].get<std::string>(), "image"), "image",
                    1u << 24);
}

TEST(ParallelServer, TwoHostsServeOneProcessesImageAndStopWhenARankDies) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  const int store_port = free_port();
  CliProcess rank0(host_args(0, store_port));
  CliProcess rank1(host_args(1, store_port));
  const int port = rank0.port();
  ASSERT_GT(port, 0) << rank0.err() << rank1.err();
  EXPECT_NE(rank0.err().find("parallel cfg over 2 ranks"), std::string::npos) << rank0.err();
  httplib::Client two("127.0.0.1", port);
  two.set_read_timeout(300);

  // One process: the same command without the group, so the same request defaults apply.
  CliProcess single({"serve", "-m", kDemo, "--port", "0", "--dtype", "fp32"});
  ASSERT_GT(single.port(), 0) << single.err();
  httplib::Client one("127.0.0.1", single.port());
  one.set_read_timeout(300);
  std::vector<Image> served;
  for (uint64_t seed : {11u, 12u}) {
    const Image expected = a1111_image(one, a1111_body(seed));
    const Image got = a1111_image(two, a1111_body(seed));
    // fp32, batch of 1 vs 2 in the UNet, and each process picks its own thread count (so its own
    // reduction order): 6 DDIM steps at cfg 7 amplify the last bits to a few levels at most.
    EXPECT_LE(worst_difference(expected, got), 6) << "seed " << seed;
    EXPECT_LT(mean_difference(expected, got), 0.25) << "seed " << seed;
    served.push_back(got);
  }
  EXPECT_GT(worst_difference(served[0], served[1]), 16);  // the seeds differ, so do the images
  // No body at all, as A1111 clients send it: nothing runs, the ranks stay in step.
  auto interrupt = two.Post("/sdapi/v1/interrupt");
  ASSERT_TRUE(interrupt);
  EXPECT_EQ(interrupt->status, 200);

  // Rank 1 dies: the next job fails, and rank 0 stops saying why (exit 1, not a hang).
  rank1.signal(SIGKILL);
  rank1.wait();
  int status = 0;
  a1111_image(two, a1111_body(13), &status);
  EXPECT_NE(status, 200);
  EXPECT_EQ(rank0.wait(), 1) << rank0.err();
  EXPECT_NE(rank0.err().find("parallel group broke"), std::string::npos) << rank0.err();
}

// The local launcher: `--devices cpu,cpu` serves until interrupted, and stops every rank.
TEST(ParallelServer, LocalRanksServeAndStopTogetherOnSigint) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  CliProcess launcher(
      {"serve", "-m", kDemo, "--port", "0", "--dtype", "fp32", "--devices", "cpu,cpu"});
  const int port = launcher.port();
  ASSERT_GT(port, 0) << launcher.err();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300);
  const Image got = a1111_image(c, a1111_body(21));
  EXPECT_EQ(got.width, 128) << launcher.err();
  launcher.signal(SIGINT);
  EXPECT_EQ(launcher.wait(), 0) << launcher.err();
  EXPECT_NE(launcher.err().find("stopped (all ranks)"), std::string::npos) << launcher.err();
}

// Modes a family cannot run, refused before anything loads.
TEST(ParallelServer, ModesTheFamilyCannotRunAreRefusedBeforeLoading) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  test::TempDir dir;
  for (const auto& [args, part] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--devices", "cpu,cpu", "--parallel", "ulysses"}, "runs --parallel cfg"},
           {{"--devices", "cpu,cpu,cpu"}, "at most two"},
           {{"--parallel", "cfg"}, "torchrun sets RANK"}}) {
    std::vector<std::string> all = {"serve", "-m", kDemo, "--port", "0"};
    all.insert(all.end(), args.begin(), args.end());
    CliProcess p(all);
    EXPECT_EQ(p.wait(), 1) << p.err();
    EXPECT_NE(p.err().find(part), std::string::npos) << p.err();
    EXPECT_EQ(p.err().find("loading"), std::string::npos) << p.err();
  }
}

}  // namespace test_server_parallel
}  // namespace diffuse
