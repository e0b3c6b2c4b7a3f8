// The jobs of a parallel server (`diffuse serve --devices D0,D1,...` or one rank per host by
// the torchrun convention): rank 0 serves HTTP and queues the jobs as any server does; it hands
// each job to the other ranks, and all run it together over their groups (CFG-parallel,
// Ulysses). At every step the ranks agree on going on, cancelling or finishing early (A1111's
// interrupt), so a job a client cancels stops on every rank at the same step, and the next job
// starts in step again.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "parallel/rank_group.h"
#include "server/engine.h"

namespace diffuse::server {

// Rank 0: an Engine that hands each job to the other ranks of `world` and runs it with them; the
// queue and the routes see an ordinary engine.
class GroupLeaderEngine : public Engine {
 public:
  // `on_broken` is called once, from the job's thread, when the group can no longer run jobs
  // together (a rank died, hung past the timeout or parted from the others); the server should
  // then stop. Every later job fails with the reason.
  GroupLeaderEngine(Engine& inner, std::shared_ptr<parallel::RankGroup> world,
                    std::function<void(const std::string&)> on_broken);
  // Releases the followers if nobody did (a server that ends by an error): they never wait
  // for a job that cannot come.
  ~GroupLeaderEngine() override;

  const PipelineInfo& info() const override { return inner_.info(); }
  ModelDefaults defaults() const override { return inner_.defaults(); }
  JobOutput run(const JobRequest& request, JobContext& context) override;

  // Tells the other ranks that no more jobs come (they return from follow_jobs), then waits up
  // to `ack_timeout` for all of them to have read it: the store they read it from may be this
  // process's (torchrun's TCPStore) and goes with it. Once; no job may run meanwhile.
  void release_followers(std::chrono::milliseconds ack_timeout);
  // Why the group broke; empty while it is whole.
  std::string broken() const;

 private:
  void mark_broken(const std::string& why);

  Engine& inner_;
  std::shared_ptr<parallel::RankGroup> world_;
  std::function<void(const std::string&)> on_broken_;
  int64_t jobs_ = 0;
  bool released_ = false;
  mutable std::mutex mutex_;
  std::string broken_;
};

// The ranks other than 0: runs the jobs rank 0 hands out, in its order, until it says no more
// come (then returns). A job that fails on every rank alike (a request the pipeline refuses) is
// over for all and the next one runs; diffuse::Error when the group broke (rank 0 is gone, a
// rank hung past the timeout or the ranks parted).
void follow_jobs(Engine& engine, parallel::RankGroup& world);

}  // namespace diffuse::server
