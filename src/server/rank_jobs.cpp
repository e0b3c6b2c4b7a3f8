#include "server/rank_jobs.h"

#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <vector>

#include "diffuse/errors.h"
#include "server/job_wire.h"

namespace diffuse::server {
namespace {

// The store key under which rank 0 announces job `n` (the size of its bytes) or the end.
std::string job_key(int64_t n) {
  return "serve/job/" + std::to_string(n);
}
constexpr const char* kNoMoreJobs = "stop";
constexpr const char* kReleasedCount = "serve/released";
constexpr const char* kAllReleased = "serve/all_released";

// The group can no longer run jobs together: an exchange failed, or the ranks are at different
// points of a job.
class GroupBroken : public Error {
 public:
  using Error::Error;
};

// Where a rank is when the ranks agree: after a step (its value: 0 go on, 1 finish now, 2
// cancel) or at the end of a job (0 its part is done, 1 it failed, 2 it was cancelled).
enum class Point { kStep = 1, kEnd = 2 };
constexpr int kGoOn = 0, kFinish = 1, kCancel = 2;
constexpr int kDone = 0, kFailed = 1, kCancelled = 2;

const char* point_name(int point) {
  return point == static_cast<int>(Point::kStep) ? "a step" : "the end of a job";
}

// Every rank's value at `point`, in rank order. GroupBroken when the exchange fails or some rank
// is at another point (the ranks parted: one failed where the others did not).
std::vector<int> agree(parallel::RankGroup& world, Point point, int value) {
  std::vector<torch::Tensor> all;
  try {
    const auto mine =
        torch::tensor({static_cast<float>(point), static_cast<float>(value)}).to(world.device());
    all = world.all_gather(mine, point == Point::kStep ? "the step's decision" : "the job's end");
  } catch (const Error& e) {
    throw GroupBroken(e.what());
  }
  std::vector<int> values;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto said = all[r].to(torch::kCPU);
    const int at = static_cast<int>(said[0].item<float>());
    if (at != static_cast<int>(point))
      throw GroupBroken("the ranks parted: rank " + std::to_string(world.rank()) + " is at " +
                        point_name(static_cast<int>(point)) + ", rank " + std::to_string(r) +
                        " at " + point_name(at) + " (one failed where the others did not)");
    values.push_back(static_cast<int>(said[1].item<float>()));
  }
  return values;
}

// The job's context on every rank: what the steps do is what all ranks agreed. Rank 0 asks its
// queue (`local`); the others have no say.
class AgreedContext : public JobContext {
 public:
  AgreedContext(parallel::RankGroup& world, JobContext* local) : world_(world), local_(local) {}

  StepAction step(int done, int total, std::string preview_png) override {
    int mine = kGoOn;
    if (local_) {
      const StepAction a = local_->step(done, total, std::move(preview_png));
      mine = a.cancel() ? kCancel : a.finish() ? kFinish : kGoOn;
    }
    int agreed = kGoOn;
    for (int v : agree(world_, Point::kStep, mine)) agreed = std::max(agreed, v);
    if (agreed == kCancel) cancelled_ = true;
    if (agreed == kFinish) interrupted_ = true;
    if (cancelled_) return false;
    return interrupted_ ? StepAction::finish_now() : StepAction(true);
  }
  // What the ranks agreed, never the queue's state of this moment: a cancel that arrives
  // between two images acts at the next step, on every rank alike.
  bool cancelled() const override { return cancelled_; }
  bool interrupted() const override { return interrupted_; }

 private:
  parallel::RankGroup& world_;
  JobContext* local_;
  bool cancelled_ = false, interrupted_ = false;
};

// The job's bytes from rank 0 to every other rank, in one all-to-all.
void hand_out(parallel::RankGroup& world, const std::string& bytes) {
  const auto n = static_cast<int64_t>(bytes.size());
  auto send = torch::empty({n}, torch::kUInt8);
  std::memcpy(send.data_ptr(), bytes.data(), bytes.size());
  std::vector<int64_t> send_counts(static_cast<size_t>(world.size()), n),
      recv_counts(send_counts.size(), 0);
  send_counts[0] = 0;
  world.all_to_all(send.to(world.device()), send_counts, recv_counts, "the job");
}

std::string receive(parallel::RankGroup& world, const std::string& notice) {
  int64_t n = -1;
  try {
    size_t used = 0;
    n = std::stoll(notice, &used);
    if (used != notice.size()) n = -1;
  } catch (const std::exception&) {
  }
  if (n < 1)
    throw GroupBroken("rank 0 announced a job as '" + notice.substr(0, 40) +
                      "', not a size in bytes (another program on the store?)");
  std::vector<int64_t> send_counts(static_cast<size_t>(world.size()), 0), recv_counts = send_counts;
  recv_counts[0] = n;
  torch::Tensor got;
  try {
    got = world
              .all_to_all(
                  torch::empty({0}, torch::TensorOptions(torch::kUInt8).device(world.device())),
                  send_counts, recv_counts, "the job")
              .to(torch::kCPU)
              .contiguous();
  } catch (const Error& e) {
    throw GroupBroken(e.what());
  }
  return std::string(static_cast<const char*>(got.data_ptr()), static_cast<size_t>(n));
}

}  // namespace

GroupLeaderEngine::GroupLeaderEngine(Engine& inner, std::shared_ptr<parallel::RankGroup> world,
                                     std::function<void(const std::string&)> on_broken)
    : Engine(inner.model_path()),
      inner_(inner),
      world_(std::move(world)),
      on_broken_(std::move(on_broken)) {
  if (!world_ || world_->rank() != 0)
    throw InvalidArgument("a parallel server's jobs are handed out by rank 0");
}

GroupLeaderEngine::~GroupLeaderEngine() {
  release_followers(std::chrono::milliseconds(0));
}

std::string GroupLeaderEngine::broken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

void GroupLeaderEngine::mark_broken(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) return;
    broken_ = why;
  }
  if (on_broken_) on_broken_(why);
}

JobOutput GroupLeaderEngine::run(const JobRequest& request, JobContext& context) {
  if (const auto why = broken(); !why.empty())
    throw Error("the server's parallel group is broken (" + why + "); restart it");
  const std::string bytes = encode_job(request);  // a job that cannot travel fails alone
  const int64_t n = ++jobs_;
  try {
    world_->post(job_key(n), std::to_string(bytes.size()));
    if (n > 1) world_->drop_post(job_key(n - 1));  // every rank has finished job n - 1
    hand_out(*world_, bytes);
  } catch (const Error& e) {
    mark_broken(e.what());
    throw Error(std::string("handing the job to the other ranks failed: ") + e.what());
  }
  AgreedContext agreed(*world_, &context);
  JobOutput out;
  std::exception_ptr failure;
  int outcome = kDone;
  try {
    out = inner_.run(request, agreed);
  } catch (const GroupBroken& e) {
    mark_broken(e.what());
    throw;
  } catch (const Cancelled&) {
    failure = std::current_exception();
    outcome = kCancelled;
  } catch (const std::exception&) {
    failure = std::current_exception();
    outcome = kFailed;
  }
  std::vector<int> outcomes;
  try {
    outcomes = agree(*world_, Point::kEnd, outcome);
  } catch (const GroupBroken& e) {
    // Most often a rank died during the job, and the job's own exchange failed first.
    mark_broken(e.what());
    throw Error(std::string("the parallel group broke during the job: ") + e.what());
  }
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 1; r < outcomes.size(); ++r)
    if (outcomes[r] != kDone)
      out.warnings.push_back("rank " + std::to_string(r) +
                             " could not finish its own part after the last exchange (its log "
                             "says why); the images are whole");
  return out;
}

void GroupLeaderEngine::release_followers(std::chrono::milliseconds ack_timeout) {
  if (released_) return;
  released_ = true;
  try {
    world_->post(job_key(jobs_ + 1), kNoMoreJobs);
    if (ack_timeout.count() > 0) world_->wait_post(kAllReleased, ack_timeout);
  } catch (const Error& e) {
    // The others are gone already (their launcher stopped them, or the group broke).
    std::cerr << "diffuse serve: the other ranks did not all confirm the end: " << e.what() << "\n";
  }
}

void follow_jobs(Engine& engine, parallel::RankGroup& world) {
  for (int64_t n = 1;; ++n) {
    const std::string notice = world.wait_post(job_key(n), std::chrono::milliseconds(0));
    if (notice == kNoMoreJobs) {
      if (world.add_post(kReleasedCount, 1) == world.size() - 1) world.post(kAllReleased, "1");
      return;
    }
    const std::string bytes = receive(world, notice);
    AgreedContext agreed(world, nullptr);
    int outcome = kDone;
    try {
      JobRequest request = decode_job(bytes);
      request.preview = false;  // rank 0 shows the previews
      engine.run(request, agreed);
    } catch (const GroupBroken&) {
      throw;
    } catch (const Cancelled&) {
      outcome = kCancelled;
    } catch (const std::exception& e) {
      std::cerr << "diffuse serve (rank " << world.rank() << "): job " << n
                << " failed here: " << e.what() << "\n";
      outcome = kFailed;
    }
    agree(world, Point::kEnd, outcome);
  }
}

}  // namespace diffuse::server
