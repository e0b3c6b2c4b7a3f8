// Runs a set of worker processes to completion as one unit: if any of them fails, the others
// are stopped, and none outlives this process. Linux (fork/exec, prctl, poll).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace diffuse::parallel {

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
// exited 0.
void run_workers(const std::vector<WorkerSpec>& workers, std::chrono::milliseconds grace);

// This process's command line, argv[0] included (from /proc/self/cmdline), to repeat it in
// the workers.
std::vector<std::string> own_command_line();

}  // namespace diffuse::parallel
