// One queue for all requests: jobs run one at a time on the device in submission order on a
// worker thread of their own; a bounded number wait. Any job can be cancelled: a waiting one
// leaves the queue, a running one stops at its next step (the pipeline unwinds and frees its
// tensors).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "diffuse/errors.h"
#include "server/job.h"

namespace diffuse::server {

// The queue is full: answered 503 with Retry-After.
class QueueFull : public Error {
 public:
  QueueFull(const std::string& what, double retry_after_s)
      : Error(what), retry_after_s(retry_after_s) {}
  double retry_after_s;
};
// The server is shutting down: answered 503.
class ShuttingDown : public Error {
 public:
  using Error::Error;
};

// Handed to the runner: reports progress, and tells it when to stop.
class JobContext {
 public:
  virtual ~JobContext() = default;
  // After each step: steps done / total over the whole job, an optional preview PNG. Returns
  // false when the job was cancelled (the runner then stops, typically by throwing Cancelled),
  // StepAction::finish_now() when it was interrupted (the runner decodes what it has and
  // starts no further image).
  virtual StepAction step(int done, int total, std::string preview_png) = 0;
  virtual bool cancelled() const = 0;
  virtual bool interrupted() const = 0;
};

using JobRunner = std::function<JobOutput(const JobRequest&, JobContext&)>;

struct QueueCounts {
  uint64_t submitted = 0, succeeded = 0, failed = 0, cancelled = 0, rejected = 0;
};

class JobQueue {
 public:
  // max_waiting: jobs that may wait behind the running one; keep_finished: finished jobs (and
  // their images) kept for clients to fetch, oldest dropped first.
  JobQueue(JobRunner runner, size_t max_waiting, size_t keep_finished = 64);
  ~JobQueue();
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // Returns the job id at once. Throws QueueFull or ShuttingDown.
  std::string submit(JobRequest request);
  std::optional<JobSnapshot> get(const std::string& id) const;
  // Waits until the job changes past `after_seq` (or ends), the timeout passes or the queue
  // shuts down; nullopt for an unknown id.
  std::optional<JobSnapshot> wait(const std::string& id, uint64_t after_seq,
                                  std::chrono::milliseconds timeout) const;
  // Waits until the job has ended (or the queue shuts down).
  std::optional<JobSnapshot> wait_finished(const std::string& id) const;
  // false for an unknown or already finished job.
  bool cancel(const std::string& id);
  // AUTOMATIC1111's interrupt: a running job finishes at its next step with the image as far as
  // it got (it succeeds, marked interrupted); a waiting one is cancelled. false for an unknown
  // or already finished job.
  bool interrupt(const std::string& id);
  // The running job, else the most recently finished one.
  std::optional<JobSnapshot> current_or_last() const;
  std::optional<JobSnapshot> last_finished() const;
  std::vector<JobSnapshot> list() const;  // newest first
  size_t waiting() const;
  size_t max_waiting() const { return max_waiting_; }
  QueueCounts counts() const;
  // While paused, waiting jobs are not started (a running one goes on): for draining and tests.
  void set_paused(bool paused);
  // Stops accepting, cancels waiting jobs, cancels the running one if asked (else lets it
  // finish), and joins the worker. Idempotent.
  void shutdown(bool cancel_running);
  bool stopping() const;

 private:
  struct Job;
  class Context;
  void worker_loop();
  void retire(const std::shared_ptr<Job>& job);  // under lock
  JobSnapshot snapshot(const Job& job) const;    // under lock
  double retry_after_estimate() const;           // under lock

  JobRunner runner_;
  const size_t max_waiting_, keep_finished_;
  mutable std::mutex mutex_;
  mutable std::condition_variable work_cv_, change_cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  std::shared_ptr<Job> running_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::string> finished_;  // ids, oldest first
  std::string last_finished_;
  QueueCounts counts_;
  uint64_t seq_ = 0;
  double last_duration_s_ = 0;
  bool paused_ = false, stopping_ = false;
  std::thread worker_;
};

}  // namespace diffuse::server
