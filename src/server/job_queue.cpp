#include "server/job_queue.h"

#include <algorithm>
#include <cstdio>
#include <random>

namespace diffuse::server {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Ids are not guessable from one another: another client cannot walk the job list.
std::string new_id() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

struct JobQueue::Job {
  JobRequest request;
  JobSnapshot snap;
  std::atomic<bool> cancel{false};
  std::atomic<bool> interrupt{false};
  std::chrono::steady_clock::time_point started;
};

class JobQueue::Context : public JobContext {
 public:
  Context(JobQueue& q, Job& job) : q_(q), job_(job) {}
  StepAction step(int done, int total, std::string preview_png) override {
    std::lock_guard<std::mutex> lock(q_.mutex_);
    auto& p = job_.snap.progress;
    p.step = done;
    p.total = total;
    p.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job_.started).count();
    p.eta_s = done > 0 && total >= done ? p.elapsed_s / done * (total - done) : -1;
    if (!preview_png.empty()) {
      p.preview_png = std::move(preview_png);
      p.preview_step = done;
    }
    job_.snap.seq = ++q_.seq_;
    q_.change_cv_.notify_all();
    if (job_.cancel.load()) return false;
    return job_.interrupt.load() ? StepAction::finish_now() : StepAction(true);
  }
  bool cancelled() const override { return job_.cancel.load(); }
  bool interrupted() const override { return job_.interrupt.load(); }

 private:
  JobQueue& q_;
  Job& job_;
};

JobQueue::JobQueue(JobRunner runner, size_t max_waiting, size_t keep_finished)
    : runner_(std::move(runner)),
      max_waiting_(max_waiting),
      keep_finished_(std::max<size_t>(keep_finished, 1)) {
  worker_ = std::thread([this] { worker_loop(); });
}

JobQueue::~JobQueue() {
  shutdown(true);
}

double JobQueue::retry_after_estimate() const {
  const double per_job = last_duration_s_ > 0 ? last_duration_s_ : 5.0;
  return std::max(1.0, per_job * static_cast<double>(waiting_.size() + (running_ ? 1 : 0)));
}

std::string JobQueue::submit(JobRequest request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw ShuttingDown("the server is shutting down and accepts no new jobs");
  if (waiting_.size() >= max_waiting_) {
    ++counts_.rejected;
    throw QueueFull("the queue is full (" + std::to_string(waiting_.size()) +
                        " jobs waiting, limit " + std::to_string(max_waiting_) + "); retry later",
                    retry_after_estimate());
  }
  auto job = std::make_shared<Job>();
  std::string id = new_id();
  while (jobs_.count(id)) id = new_id();
  job->snap.id = id;
  job->snap.kind = request.kind;
  job->snap.state = JobState::queued;
  job->snap.seed = request.config.seed.value_or(0);
  job->snap.created_at = unix_now();
  job->snap.request = request.describe();
  job->snap.api = request.api;
  job->snap.seq = ++seq_;
  job->request = std::move(request);
  jobs_[id] = job;
  waiting_.push_back(job);
  ++counts_.submitted;
  work_cv_.notify_one();
  change_cv_.notify_all();
  return id;
}

JobSnapshot JobQueue::snapshot(const Job& job) const {
  JobSnapshot s = job.snap;
  if (s.state == JobState::queued) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const std::shared_ptr<Job>& j) { return j.get() == &job; });
    s.position = static_cast<int>(it - waiting_.begin()) + 1;
  }
  return s;
}

std::optional<JobSnapshot> JobQueue::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return snapshot(*it->second);
}

std::optional<JobSnapshot> JobQueue::wait(const std::string& id, uint64_t after_seq,
                                          std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  std::shared_ptr<Job> job = it->second;  // stays valid even if retired meanwhile
  change_cv_.wait_for(lock, timeout, [&] {
    return job->snap.seq > after_seq || is_finished(job->snap.state) || stopping_;
  });
  return snapshot(*job);
}

std::optional<JobSnapshot> JobQueue::wait_finished(const std::string& id) const {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  std::shared_ptr<Job> job = it->second;
  change_cv_.wait(lock, [&] {
    return is_finished(job->snap.state) || (stopping_ && !running_ && waiting_.empty());
  });
  return snapshot(*job);
}

bool JobQueue::interrupt(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || is_finished(it->second->snap.state)) return false;
    if (it->second->snap.state == JobState::running) {
      it->second->interrupt = true;
      it->second->snap.interrupted = true;
      it->second->snap.seq = ++seq_;
      change_cv_.notify_all();
      return true;
    }
  }
  return cancel(id);
}

bool JobQueue::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || is_finished(it->second->snap.state)) return false;
  auto job = it->second;
  job->cancel = true;
  auto w = std::find(waiting_.begin(), waiting_.end(), job);
  if (w != waiting_.end()) {
    waiting_.erase(w);
    job->snap.state = JobState::cancelled;
    job->snap.error = "cancelled before it started";
    job->snap.finished_at = unix_now();
    ++counts_.cancelled;
    retire(job);
  }
  job->snap.seq = ++seq_;
  change_cv_.notify_all();
  return true;
}

void JobQueue::retire(const std::shared_ptr<Job>& job) {
  finished_.push_back(job->snap.id);
  last_finished_ = job->snap.id;
  while (finished_.size() > keep_finished_) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

std::optional<JobSnapshot> JobQueue::current_or_last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_) return snapshot(*running_);
  auto it = jobs_.find(last_finished_);
  if (it == jobs_.end()) return std::nullopt;
  return snapshot(*it->second);
}

std::optional<JobSnapshot> JobQueue::last_finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(last_finished_);
  if (it == jobs_.end()) return std::nullopt;
  return snapshot(*it->second);
}

std::vector<JobSnapshot> JobQueue::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<JobSnapshot> out;
  for (const auto& [id, job] : jobs_) out.push_back(snapshot(*job));
  std::sort(out.begin(), out.end(), [](const JobSnapshot& a, const JobSnapshot& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.seq > b.seq;
  });
  return out;
}

size_t JobQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_.size();
}

QueueCounts JobQueue::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void JobQueue::set_paused(bool paused) {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = paused;
  work_cv_.notify_all();
}

bool JobQueue::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

void JobQueue::shutdown(bool cancel_running) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    while (!waiting_.empty()) {
      auto job = waiting_.front();
      waiting_.pop_front();
      job->cancel = true;
      job->snap.state = JobState::cancelled;
      job->snap.error = "cancelled: the server is shutting down";
      job->snap.finished_at = unix_now();
      job->snap.seq = ++seq_;
      ++counts_.cancelled;
      retire(job);
    }
    if (running_ && cancel_running) running_->cancel = true;
    work_cv_.notify_all();
    change_cv_.notify_all();
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void JobQueue::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || (!paused_ && !waiting_.empty()); });
      if (stopping_) return;
      job = waiting_.front();
      waiting_.pop_front();
      running_ = job;
      job->snap.state = JobState::running;
      job->snap.started_at = unix_now();
      job->started = std::chrono::steady_clock::now();
      job->snap.seq = ++seq_;
      change_cv_.notify_all();
    }
    Context ctx(*this, *job);
    JobState state = JobState::succeeded;
    std::string error;
    std::shared_ptr<const JobOutput> output;
    try {
      output = std::make_shared<const JobOutput>(runner_(job->request, ctx));
    } catch (const Cancelled&) {
      state = JobState::cancelled;
      error = "cancelled while running";
    } catch (const std::exception& e) {
      state = job->cancel ? JobState::cancelled : JobState::failed;
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    job->snap.state = state;
    job->snap.error = error;
    job->snap.output = output;
    job->snap.finished_at = unix_now();
    job->snap.seq = ++seq_;
    last_duration_s_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job->started).count();
    if (state == JobState::succeeded) ++counts_.succeeded;
    if (state == JobState::failed) ++counts_.failed;
    if (state == JobState::cancelled) ++counts_.cancelled;
    running_.reset();
    retire(job);
    change_cv_.notify_all();
  }
}

}  // namespace diffuse::server
