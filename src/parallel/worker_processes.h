// Runs a set of worker processes to completion as one unit: if any of them fails, the others
// are stopped, and none outlives this process. Linux (fork/exec, prctl, poll).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "diffuse/errors.h"

namespace diffuse::parallel {

// The run was stopped by SIGINT/SIGTERM: the CLI exits with 128 + signal() after the callers'
// cleanup has run.
class WorkersInterrupted : public Cancelled {
 public:
  explicit WorkersInterrupted(int sig)
      : Cancelled("interrupted by signal " + std::to_string(sig) + "; the workers were stopped"),
        signal_(sig) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

struct WorkerSpec {
  std::string label;              // "rank 1 on cpu", for messages
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=VALUE" added to (or replacing in) this environment
};

// Starts every worker (executable: this program, /proc/self/exe) and waits for all of them.
// Each child gets PR_SET_PDEATHSIG(SIGKILL), so it dies with this process however that ends,
// and holds the write end of a pipe whose end-of-file tells this process it is gone (no
// polling of waitpid, no sleeps). When one worker fails (non-zero exit or a signal) the
// others get SIGTERM, then SIGKILL after `grace`; every child is reaped before returning.
// Throws diffuse::Error listing each failed worker (the first failure first) unless all
// exited 0. A SIGINT or SIGTERM to this process meanwhile stops the workers the same way and
// throws WorkersInterrupted once all are reaped (the previous handlers are back by then).
void run_workers(const std::vector<WorkerSpec>& workers, std::chrono::milliseconds grace);

// A folder only this user can enter (mkdtemp: 0700) for the workers' store and files, removed
// with everything in it. IoError naming the pattern when it cannot be made.
class PrivateTempDir {
 public:
  PrivateTempDir();
  ~PrivateTempDir();
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// This process's command line, argv[0] included (from /proc/self/cmdline), to repeat it in
// the workers.
std::vector<std::string> own_command_line();

}  // namespace diffuse::parallel
