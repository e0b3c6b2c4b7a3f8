#include "parallel/worker_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "diffuse/errors.h"

extern char** environ;

namespace diffuse::parallel {
namespace {

struct Child {
  const WorkerSpec* spec = nullptr;
  pid_t pid = -1;
  int life_fd = -1;  // read end: EOF once the child (the only writer) is gone
  bool done = false;
  bool stopped = false;  // we signalled it after another worker failed
  int status = 0;
};

// NULL-terminated char* arrays built before fork: the child may only call async-signal-safe
// functions between fork and exec, so no allocation there.
struct CStrings {
  std::vector<std::string> storage;
  std::vector<char*> pointers;
  explicit CStrings(std::vector<std::string> s) : storage(std::move(s)) {
    for (auto& x : storage) pointers.push_back(x.data());
    pointers.push_back(nullptr);
  }
};

std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> vars;
  std::vector<std::string> order;
  auto put = [&](const std::string& entry) {
    const auto eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (!vars.count(name)) order.push_back(name);
    vars[name] = entry;
  };
  for (char** e = environ; e && *e; ++e) put(*e);
  for (const auto& e : extra) put(e);
  std::vector<std::string> out;
  for (const auto& n : order) out.push_back(vars[n]);
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) +
           (name ? std::string(" (") + name + ")" : std::string());
  }
  return "ended with wait status " + std::to_string(status);
}

bool failed(int status) {
  return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

// Ended by our SIGTERM (the CLI's handler exits 128 + 15) or SIGKILL, not by a failure of its
// own.
bool was_stopped(const Child& c) {
  if (!c.stopped) return false;
  if (WIFEXITED(c.status)) return WEXITSTATUS(c.status) == 128 + SIGTERM;
  return WIFSIGNALED(c.status) && (WTERMSIG(c.status) == SIGTERM || WTERMSIG(c.status) == SIGKILL);
}

void start(Child& c, const pid_t parent) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("CFG-parallel: cannot create a pipe: ") + std::strerror(errno));
  CStrings argv(c.spec->argv), envp(merged_environment(c.spec->env));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(std::string("CFG-parallel: cannot start ") + c.spec->label + ": " +
                std::strerror(errno));
  }
  if (pid == 0) {
    // Dies with the launcher, even when it is killed outright; and if it already died
    // between fork and prctl, exit now.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // Only this child's write end survives exec (the other pipes stay close-on-exec), so its
    // exit alone closes the pipe.
    ::fcntl(fds[1], F_SETFD, 0);
    ::execve("/proc/self/exe", argv.pointers.data(), envp.pointers.data());
    static const char kMessage[] = "error: CFG-parallel: cannot execute /proc/self/exe\n";
    const ssize_t w = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)w;
    ::_exit(127);
  }
  ::close(fds[1]);
  c.pid = pid;
  c.life_fd = fds[0];
}

// While the workers run, SIGINT and SIGTERM to this process stop them in order instead of
// ending it at once (which would skip the caller's cleanup, e.g. CFG-parallel's temporary
// store folder): the handler writes the signal into a pipe that the wait loop polls with the
// workers (no race between a check and the poll), and the loop treats it like a failure.
int g_interrupt_pipe = -1;

extern "C" void on_worker_interrupt(int sig) {
  const char byte = static_cast<char>(sig);
  const ssize_t w = ::write(g_interrupt_pipe, &byte, 1);
  (void)w;
}

class InterruptPipe {
 public:
  InterruptPipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("CFG-parallel: cannot create a pipe: ") + std::strerror(errno));
    g_interrupt_pipe = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_worker_interrupt;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
  }
  ~InterruptPipe() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    g_interrupt_pipe = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  InterruptPipe(const InterruptPipe&) = delete;
  InterruptPipe& operator=(const InterruptPipe&) = delete;
  int read_fd() const { return fds_[0]; }
  // The signal received (0: none yet).
  int take() {
    char byte = 0;
    int sig = 0;
    while (::read(fds_[0], &byte, 1) == 1) sig = static_cast<unsigned char>(byte);
    return sig;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {
  }, old_term_{};
};

void signal_all(std::vector<Child>& children, int sig) {
  for (auto& c : children)
    if (!c.done && c.pid > 0) {
      ::kill(c.pid, sig);
      c.stopped = true;
    }
}

}  // namespace

void run_workers(const std::vector<WorkerSpec>& workers, std::chrono::milliseconds grace) {
  std::vector<Child> children(workers.size());
  const pid_t self = ::getpid();
  std::vector<const Child*> failures;  // in the order they were seen
  try {
    for (size_t i = 0; i < workers.size(); ++i) {
      children[i].spec = &workers[i];
      start(children[i], self);
    }
  } catch (...) {
    signal_all(children, SIGKILL);
    for (auto& c : children)
      if (c.pid > 0) {
        ::waitpid(c.pid, nullptr, 0);
        ::close(c.life_fd);
      }
    throw;
  }
  InterruptPipe interrupts;
  int interrupted = 0;
  bool stopping = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Child*> which;
    for (auto& c : children)
      if (!c.done) {
        fds.push_back({c.life_fd, POLLIN, 0});
        which.push_back(&c);
      }
    if (fds.empty()) break;
    fds.push_back({interrupts.read_fd(), POLLIN, 0});
    int wait_ms = -1;
    if (stopping && !killed) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          kill_at - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    const int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      signal_all(children, SIGKILL);
      killed = true;
      continue;
    }
    if (n == 0) {  // the grace period is over: whoever is still there is stuck
      signal_all(children, SIGKILL);
      killed = true;
      continue;
    }
    if (fds.back().revents) {
      fds.pop_back();
      if (const int sig = interrupts.take(); sig && !interrupted) {
        interrupted = sig;
        if (!stopping) {
          stopping = true;
          kill_at = std::chrono::steady_clock::now() + grace;
          signal_all(children, SIGTERM);
        }
      }
    } else {
      fds.pop_back();
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[64];
      if (::read(fds[i].fd, buf, sizeof buf) > 0) continue;  // nobody writes; ignore
      Child& c = *which[i];
      while (::waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
      }
      ::close(c.life_fd);
      c.done = true;
      if (failed(c.status)) failures.push_back(&c);
    }
    // Everyone that ended in this round is reaped before the others are signalled, so a
    // worker that failed by itself is never reported as stopped.
    if (!failures.empty() && !stopping) {
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + grace;
      signal_all(children, SIGTERM);
    }
  }
  // A signal whose byte was still in the pipe when the last worker ended (a Ctrl-C reaches the
  // workers too, and they may all be gone first) still counts.
  if (!interrupted) interrupted = interrupts.take();
  if (interrupted) throw WorkersInterrupted(interrupted);
  if (failures.empty()) return;
  std::string message = "CFG-parallel run failed: ";
  bool first = true;
  for (const Child* c : failures) {
    message += (first ? "" : "; ") + c->spec->label + " " +
               (was_stopped(*c) ? std::string("was stopped") : describe_status(c->status));
    first = false;
  }
  throw Error(message + " (their own messages are above)");
}

PrivateTempDir::PrivateTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/diffuse-cfg-XXXXXX";
  if (!::mkdtemp(pattern.data()))
    throw IoError("parallel run: cannot create a temporary folder from '" + pattern +
                  "': " + std::strerror(errno));
  path_ = pattern;
}

PrivateTempDir::~PrivateTempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  if (args.empty()) throw Error("CFG-parallel: cannot read this process's command line");
  return args;
}

}  // namespace diffuse::parallel
